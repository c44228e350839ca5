"""SparseLoCo's hooks on one process: the outer step by hand, config checks, and exact resume of the EF buffer."""

import pytest
import torch

from decentrain.algorithms.outer.optimizers import SGDConfig
from decentrain.algorithms.sparseloco import SparseLoCo, SparseLoCoConfig
from decentrain.core.world import World


def _model(values):
    m = torch.nn.Linear(4, 1, bias=False)
    m.weight.data = torch.tensor([values])
    return m


def _set(model, values):
    model.weight.data.copy_(torch.tensor([values]))


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"bits": 3}, r"algorithm.bits=3 is unknown; allowed: \[2, 4, 8\]"),
        ({"topk": 0}, r"algorithm.topk=0 must be a finite number in \[1, 4096\]"),
        ({"chunk_size": 70000}, r"algorithm.chunk_size=70000 must be a finite number in \[1, 65536\]"),
        ({"ef_decay": 1.5}, r"algorithm.ef_decay=1.5 must be a finite number in \[0, 1\]"),
        ({"ef_decay": float("nan")}, r"algorithm.ef_decay=nan"),
        (
            {"outer_optimizer": {"name": "sgd", "lr": 1.0, "momentum": 0.0, "nesterov": True}},
            r"algorithm.outer_optimizer.nesterov=true needs algorithm.outer_optimizer.momentum > 0",
        ),
        ({"adaptive_inner_steps": True}, r"algorithm.adaptive_inner_steps is not supported by sparseloco"),
    ],
)
def test_config_errors_name_the_field_and_range(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SparseLoCoConfig(**kw)


def test_outer_step_applies_the_decoded_topk_and_keeps_the_rest_as_error():
    cfg = SparseLoCoConfig(
        inner_steps=2,
        outer_optimizer=SGDConfig(lr=0.5, momentum=0.0, nesterov=False),
        tiling="flat",
        chunk_size=4,
        topk=1,
        bits=2,
        ef_decay=0.5,
        quantizer="maxabs",
    )
    model = _model([1.0, 1.0, 1.0, 1.0])
    algo = SparseLoCo(cfg, World())
    algo.on_train_start(model, None)
    assert algo.after_optimizer_step(1, model, None) == {}
    _set(model, [0.0, 3.0, 1.5, 1.0])
    m = algo.after_optimizer_step(2, model, None)
    # Δ = φ − θ = [1, −2, −0.5, 0]; top-1 is −2 (sent exactly); φ ← φ − 0.5·[0, −2, 0, 0]
    assert model.weight.data.tolist() == [[1.0, 2.0, 1.0, 1.0]]
    assert algo.ef.error.tolist() == [1.0, 0.0, -0.5, 0.0]
    assert m["outer/payload_bytes"] == 32 + 2 + 4 + 1 and m["outer/bytes_sent"] == 0.0
    assert m["outer/payload_dropped"] == 0.0 and m["outer/pseudo_grad_norm"] == pytest.approx(2.0)
    # next round, no local change: e = 0.5·[1, 0, −0.5, 0] = [0.5, 0, −0.25, 0] sends 0.5 at index 0
    algo.after_optimizer_step(3, model, None)
    algo.after_optimizer_step(4, model, None)
    assert model.weight.data.tolist() == [[0.75, 2.0, 1.0, 1.0]]
    assert algo.ef.error.tolist() == [0.0, 0.0, -0.25, 0.0]


def _run(cfg, steps, state=None, drop_error=False):
    """Drive the hooks with a fixed drift per step; optionally resume from `state`."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    algo = SparseLoCo(cfg, World())
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        algo.load_state_dict(state["algo"])
        start = state["step"]
        if drop_error:
            algo._resume["outer"]["ef"]["error"] = torch.zeros_like(algo._resume["outer"]["ef"]["error"])
    algo.on_train_start(model, None)
    g = torch.Generator().manual_seed(1)
    drifts = [torch.randn(8, 8, generator=g) * 0.1 for _ in range(steps)]
    for step in range(start + 1, steps + 1):
        with torch.no_grad():
            model.weight.add_(drifts[step - 1])
        algo.after_optimizer_step(step, model, None)
    return model, algo


def test_resume_continues_bit_exactly_and_needs_the_error_buffer():
    cfg = SparseLoCoConfig(inner_steps=3, chunk_size=16, topk=2, bits=4, ef_decay=0.9)
    straight, _ = _run(cfg, 12)
    half, algo = _run(cfg, 7)  # stops mid-round, after two syncs: the error buffer is non-zero
    assert algo.ef.error.abs().sum() > 0
    state = {"model": {k: v.clone() for k, v in half.state_dict().items()}, "algo": algo.state_dict(), "step": 7}
    resumed, _ = _run(cfg, 12, state)
    assert torch.equal(resumed.weight, straight.weight)
    dropped, _ = _run(cfg, 12, state, drop_error=True)
    assert not torch.equal(dropped.weight, straight.weight)


def _two_replicas(cfg, drifts):
    """One sync of two SparseLoCo replicas over the in-process transport; each replica's weights after it."""
    from decentrain.core.comm.inprocess_transport import InProcessHub
    from decentrain.testing import run_in_threads

    hub = InProcessHub(2)

    def replica(rank):
        model = _model([1.0, 1.0, 1.0, 1.0])
        algo = SparseLoCo(cfg, World(rank=rank, world_size=2))
        algo.transport = hub.transport(rank)
        algo.on_train_start(model, None)
        _set(model, [1.0 - d for d in drifts[rank]])  # Δ_r = φ − θ_r = drifts[rank]
        algo.after_optimizer_step(1, model, None)
        return model.weight.detach().flatten().tolist()

    return run_in_threads(replica, 2)


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        # disjoint top-1 indices: each entry moves by the full value its one sender sent (the reference's rule)
        ("mean_over_senders", [0.6, 1.0, 1.3, 1.0]),
        # the paper's literal 1/R: each entry moves by half of it, while the sender's error buffer dropped all of it
        ("sum_over_replicas", [0.8, 1.0, 1.15, 1.0]),
    ],
)
def test_disjoint_indices_move_by_what_their_sender_sent(aggregation, expected):
    cfg = SparseLoCoConfig(inner_steps=1, chunk_size=4, topk=1, bits=8, aggregation=aggregation)
    w0, w1 = _two_replicas(cfg, [[0.4, 0.0, 0.0, 0.0], [0.0, 0.0, -0.3, 0.0]])
    assert w0 == pytest.approx(expected, abs=1e-6) and w1 == w0


def test_an_index_both_replicas_sent_moves_by_their_mean():
    cfg = SparseLoCoConfig(inner_steps=1, chunk_size=4, topk=1, bits=8)
    w0, w1 = _two_replicas(cfg, [[0.4, 0.0, 0.0, 0.0], [0.2, 0.0, 0.0, 0.0]])
    assert w0 == pytest.approx([0.7, 1.0, 1.0, 1.0], abs=1e-6) and w1 == w0


def test_unknown_aggregation_names_the_field():
    with pytest.raises(
        ValueError,
        match=r"algorithm.aggregation='median' is unknown; allowed: \['mean_over_senders', 'sum_over_replicas'\]",
    ):
        SparseLoCoConfig(aggregation="median")


def test_defaults_are_the_reference_codes():
    """templar's hparams: 64×64 tiles per tensor, top-64 per tile, 2-bit statistical quantiser, β 0.95, α 1, mean over
    senders."""
    cfg = SparseLoCoConfig()
    assert (cfg.tiling, cfg.tile_size, cfg.topk, cfg.bits, cfg.quantizer, cfg.ef_decay, cfg.aggregation) == (
        "tensor",
        64,
        64,
        2,
        "statistical",
        0.95,
        "mean_over_senders",
    )
    assert (cfg.outer_optimizer.name, cfg.outer_optimizer.lr, cfg.outer_optimizer.momentum) == ("sgd", 1.0, 0.0)


def test_tensor_tiling_sends_the_same_share_of_every_tensor():
    """A 128×96 matrix is four 64×48 tiles with k = 48 each; the 1-D bias two pieces of 64 with k = 1 each."""
    model = torch.nn.Linear(96, 128)
    algo = SparseLoCo(SparseLoCoConfig(inner_steps=1), World())
    algo.on_train_start(model, None)
    assert [(g.n, g.length, g.k) for g in algo.spec.groups] == [(4, 64 * 48, 48), (2, 64, 1)]
    delta = torch.randn(128 * 96 + 128)  # Δ = φ − θ
    with torch.no_grad():
        model.weight.sub_(delta[: 128 * 96].view(128, 96))
        model.bias.sub_(delta[128 * 96 :])
    m = algo.after_optimizer_step(1, model, None)
    assert m["outer/payload_bytes"] == 32 + 2 * (4 * 48 + 2) + 4 * 2 * 5 + -(-(4 * 48 + 2) * 2 // 8)
    sent = ((algo.ef.error - delta).abs() > 1e-3).float()  # e = Δ − D(c): only what was sent differs from Δ
    w, b = sent[: 128 * 96].view(128, 96), sent[128 * 96 :]
    for rows in (slice(0, 64), slice(64, 128)):
        for cols in (slice(0, 48), slice(48, 96)):
            assert w[rows, cols].sum() == 48
    assert b[:64].sum() == 1 and b[64:].sum() == 1


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"tiling": "rows"}, r"algorithm.tiling='rows' is unknown; allowed: \['flat', 'tensor'\]"),
        ({"quantizer": "lloyd"}, r"algorithm.quantizer='lloyd' is unknown; allowed: \['maxabs', 'statistical'\]"),
        ({"topk": 5000}, r"algorithm.topk=5000 must be a finite number in \[1, 4096\]"),
    ],
)
def test_layout_config_errors_name_the_field(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SparseLoCoConfig(**kw)
