"""Compressed NoLoCo: the step equation by hand, the identity with uncompressed NoLoCo, config checks, exact resume."""

import pytest
import torch

from decentrain.algorithms.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.noloco.compressed_gossip import (
    CompressedGossip,
    Decoded,
    NoLoCoCompressionConfig,
    step_direction,
)
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.core.world import World
from decentrain.testing import run_in_threads


def test_step_direction_by_hand():
    # ĝ = learn − (mean_G D(s) − D(s_i)): s_i = [0, 4], s_j = [2, 0] -> pull [1, −2]
    g = step_direction(torch.tensor([2.0, 1.0]), torch.tensor([0.0, 4.0]), [torch.tensor([2.0, 0.0])])
    assert g.tolist() == [1.0, 3.0]
    assert step_direction(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), []).tolist() == [1.0, 2.0]  # alone: own c


@pytest.mark.parametrize(
    "aggregation, expected", [("mean_over_senders", [1.0, 2.0, 3.0]), ("sum_over_replicas", [0.5, 1.0, 3.0])]
)
def test_learning_term_averages_each_index_over_its_senders(aggregation, expected):
    """Own c sent indices 0 and 2, the partner's index 1 and 2: an index one side sent moves by its full value."""
    gossip = CompressedGossip(
        NoLoCoCompressionConfig(enabled=True, chunk_size=4, topk=2, bits=8, state_topk=2, aggregation=aggregation),
        torch.zeros(3),
    )
    own = Decoded(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1.0, 0.0, 1.0]), torch.zeros(3))
    partner = Decoded(torch.tensor([0.0, 2.0, 4.0]), torch.tensor([0.0, 1.0, 1.0]), torch.zeros(3))
    assert gossip.learning_term([own, partner]).tolist() == expected


def test_lossless_messages_give_uncompressed_noloco_pseudo_gradient():
    """With k = C and no quantisation loss ĝ_i is φ_i − θ̄_G exactly: the identity the design rests on."""
    g = torch.Generator().manual_seed(0)
    phi = [torch.randn(8, generator=g) for _ in range(3)]
    theta = [p - 0.1 * torch.randn(8, generator=g) for p in phi]
    delta = [p - t for p, t in zip(phi, theta)]
    anchor = torch.randn(8, generator=g)
    g_hat = step_direction(sum(delta) / 3, phi[0] - anchor, [p - anchor for p in phi[1:]])
    assert torch.allclose(g_hat, phi[0] - sum(theta) / 3, atol=1e-6)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"bits": 3}, r"algorithm.compression.bits=3 is unknown"),
        ({"state_bits": 1}, r"algorithm.compression.state_bits=1 is unknown"),
        ({"topk": 0}, r"algorithm.compression.topk=0 must be a finite number in \[1, 4096\]"),
        ({"anchor_every": -1}, r"algorithm.compression.anchor_every=-1"),
        ({"ef_decay": 2.0}, r"algorithm.compression.ef_decay=2"),
        ({"chunk_size": 1.5}, r"algorithm.compression.chunk_size=1.5 must be an integer"),
    ],
)
def test_compression_config_errors_name_the_field(kw, msg):
    with pytest.raises(ValueError, match=msg):
        NoLoCoCompressionConfig(**kw)


def test_compression_refuses_the_general_form_and_a_stallable_anchor():
    on = NoLoCoCompressionConfig(enabled=True)
    with pytest.raises(ValueError, match="algorithm.compression.enabled=true needs gamma=null"):
        NoLoCoConfig(compression=on, gamma=0.1)
    with pytest.raises(ValueError, match="anchor_every=0"):
        NoLoCoConfig(compression=on, deadline_s=10.0)
    NoLoCoConfig(compression=NoLoCoCompressionConfig(enabled=True, anchor_every=0), deadline_s=10.0)
    with pytest.raises(ValueError, match="with algorithm.overlap=true is not supported"):
        NoLoCoConfig(compression=on, overlap=True)  # the compressed step is synchronous


def test_a_payload_that_fails_decoding_is_reported_not_raised():
    gossip = CompressedGossip(
        NoLoCoCompressionConfig(enabled=True, chunk_size=8, topk=2, state_topk=2), torch.zeros(20)
    )
    c, s, _ = gossip.messages(torch.randn(20), torch.randn(20), round_idx=3)
    assert gossip.decode_pair(c, s, 3)[0] is not None
    assert "round" in gossip.decode_pair(c, s, 4)[1]  # a replayed round
    bad = s.clone()
    bad[32] = 200  # the first index of the first chunk, now out of range
    assert gossip.decode_pair(c, bad, 3)[0] is None


def _cfg():
    return NoLoCoConfig(
        inner_steps=3,
        outer_optimizer=OuterOptimizerConfig("noloco", lr=0.7, momentum=0.5),
        compression=NoLoCoCompressionConfig(
            enabled=True, chunk_size=16, topk=2, bits=4, state_topk=4, ef_decay=0.9, anchor_every=2
        ),
    )


def _run(steps, state=None, drop=None):
    """Drive the hooks with a fixed drift per step; optionally resume from `state` (dropping one part of it)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    algo = NoLoCo(_cfg(), World())
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        algo.load_state_dict(state["algo"])
        start = state["step"]
        comp = algo._resume["outer"]["compression"]
        if drop == "error":
            comp["ef"]["error"] = torch.zeros_like(comp["ef"]["error"])
        elif drop == "all":
            del algo._resume["outer"]["compression"]
    algo.on_train_start(model, None)
    g = torch.Generator().manual_seed(1)
    drifts = [torch.randn(8, 8, generator=g) * 0.1 for _ in range(steps)]
    metrics = []
    for step in range(start + 1, steps + 1):
        with torch.no_grad():
            model.weight.add_(drifts[step - 1])
        metrics.append(algo.after_optimizer_step(step, model, None))
    return model, algo, metrics


def test_resume_is_bit_exact_and_needs_the_error_buffer():
    straight, _, metrics = _run(12)
    sync = [m for m in metrics if "outer/payload_bytes" in m]
    assert len(sync) == 4 and all(m["outer/payload_bytes"] > 0 for m in sync)
    half, algo, _ = _run(7)  # mid-round, after two syncs and one re-anchor: e and A carry state
    assert algo.gossip.ef.error.abs().sum() > 0
    state = {"model": {k: v.clone() for k, v in half.state_dict().items()}, "algo": algo.state_dict(), "step": 7}
    resumed, _, _ = _run(12, state)
    assert torch.equal(resumed.weight, straight.weight)
    dropped, _, _ = _run(12, state, drop="error")
    assert not torch.equal(dropped.weight, straight.weight)
    with pytest.raises(ValueError, match="no compression state"):
        _run(12, state, drop="all")


def test_two_replicas_over_the_in_process_transport_keep_one_anchor_and_mix():
    """Both replicas apply the same learning update, opposite consensus pulls, and re-anchor to the same A."""
    from decentrain.core.comm.inprocess_transport import InProcessHub

    hub = InProcessHub(2)
    cfg = NoLoCoConfig(
        inner_steps=1,
        outer_optimizer=OuterOptimizerConfig("noloco", lr=0.5, momentum=0.0),
        compression=NoLoCoCompressionConfig(
            enabled=True, chunk_size=16, topk=16, bits=8, state_topk=16, state_bits=8, anchor_every=2, ef_decay=1.0
        ),
    )

    def replica(rank):
        model = torch.nn.Linear(4, 4, bias=False)
        model.weight.data.fill_(1.0)
        algo = NoLoCo(cfg, World(rank=rank, world_size=2))
        algo.transport = hub.transport(rank)
        algo.setup(model)
        steps = []
        for step in (1, 2):
            model.weight.data.add_(0.1 * (rank + 1) * step)  # replica-specific drift
            steps.append(algo.after_optimizer_step(step, model, None))
        return model.weight.detach().clone(), algo.gossip.anchor.clone(), steps

    (w0, a0, m0), (w1, a1, m1) = run_in_threads(replica, 2)
    assert torch.equal(a0, a1) and not torch.equal(a0, torch.ones(16))  # re-anchored after round 2, identically
    assert all(m["outer/partner_missed"] == 0.0 and m["outer/payload_dropped"] == 0.0 for m in m0 + m1)
    # k = C and 8-bit: near lossless, so the step is NoLoCo's:
    # round 1 φ_i = 1 − 0.5·(φ_i − θ̄) with θ̄ = 1.15 -> both 1.075
    # round 2 (θ_i = 1.075 + 0.2·(i+1)): θ̄ = 1.375, φ = 1.075 + 0.5·0.3 = 1.225 on both replicas
    assert torch.allclose(w0, torch.full((4, 4), 1.225), atol=2e-3) and torch.allclose(w1, w0, atol=2e-3)
    assert m0[1]["outer/bytes_sent"] > m0[0]["outer/bytes_sent"]  # the re-anchor round adds its all-gather share


def _four_replicas(compression, rounds=8):
    """`rounds` syncs of 4 NoLoCo replicas (H = 1, momentum 0.5) over the in-process transport, replica-specific
    drifts: each replica's weights at the start and after every round, and its metrics."""
    from decentrain.core.comm.inprocess_transport import InProcessHub

    hub = InProcessHub(4)
    cfg = NoLoCoConfig(
        inner_steps=1, outer_optimizer=OuterOptimizerConfig("noloco", lr=0.7, momentum=0.5), compression=compression
    )

    def replica(rank):
        # identical start, as after the start-up broadcast, from a generator of its own: the replicas are
        # threads, and seeding the global RNG in each let another thread draw from it in between
        model = torch.nn.Linear(16, 8)
        init = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(0.25 * torch.randn(p.shape, generator=init))
        algo = NoLoCo(cfg, World(rank=rank, world_size=4))
        algo.transport = hub.transport(rank)
        algo.setup(model)
        g = torch.Generator().manual_seed(rank + 1)
        weights, metrics = [torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])], []
        for step in range(1, rounds + 1):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=g) + 0.01 * rank)
            metrics.append(algo.after_optimizer_step(step, model, None))
            weights.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
        return weights, metrics

    return run_in_threads(replica, 4)


def test_lossless_compression_tracks_noloco_through_the_real_exchange_at_four_replicas():
    """Full top-k and 8 bits: compressed NoLoCo follows uncompressed NoLoCo (momentum 0.5) while the pairs change
    every round, so the consensus message φ − A carries real differences. Tolerance: 2 % of the weights' spread
    from their start after 8 rounds (8-bit max-abs steps are 1/255 of a chunk's largest entry; the EF re-sends
    each round's residual)."""
    from decentrain.core.comm.pairing import gossip_groups

    lossless = NoLoCoCompressionConfig(
        enabled=True, chunk_size=136, topk=136, bits=8, state_topk=136, state_bits=8, anchor_every=3
    )
    plain = _four_replicas(NoLoCoCompressionConfig())
    packed = _four_replicas(lossless)
    assert len({tuple(gossip_groups(r, 4, 0)) for r in range(8)}) > 1  # partners change
    start = plain[0][0][0]
    for rank in range(4):
        for r in range(1, 9):
            ref, got = plain[rank][0][r], packed[rank][0][r]
            scale = (ref - start).abs().max()
            assert (got - ref).abs().max() <= 0.02 * scale, (rank, r)
        assert all(m["outer/partner_missed"] == 0.0 and m["outer/payload_dropped"] == 0.0 for m in packed[rank][1])
    # replicas disagree (gossip, not an all-reduce), so the consensus term had something to carry
    finals = [packed[rank][0][-1] for rank in range(4)]
    assert min((a - b).abs().max() for i, a in enumerate(finals) for b in finals[i + 1 :]) > 1e-3


def test_lossy_compression_at_four_replicas_mixes_real_differences():
    """Default-like message sizes (6 % of Δ at 2 bits, 3 % of φ − A at 4 bits) over changing pairs: nothing dropped,
    the replicas' slow weights differ from each other (at N = 2 they would stay identical and φ_j − φ_i be 0), and
    each replica's φ − A is non-zero from the second round on, re-anchored or not."""
    lossy = NoLoCoCompressionConfig(
        enabled=True, chunk_size=136, topk=8, bits=2, state_topk=4, state_bits=4, anchor_every=3
    )
    packed = _four_replicas(lossy)
    for rank in range(4):
        assert all(m["outer/payload_dropped"] == 0.0 and m["outer/partner_missed"] == 0.0 for m in packed[rank][1])
        assert all(m["outer/anchor_drift_norm"] > 0 for m in packed[rank][1][1:])  # round 0 sends φ_0 − A_0 = 0
        assert torch.isfinite(packed[rank][0][-1]).all()
    # a pair leaves a round with one φ; replicas that met different partners since differ
    final = [packed[rank][0][-1] for rank in range(4)]
    distinct = [w for i, w in enumerate(final) if all((w - v).abs().max() > 1e-4 for v in final[:i])]
    assert len(distinct) >= 3
