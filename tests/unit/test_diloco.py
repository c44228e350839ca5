"""DiLoCo / Streaming DiLoCo hooks on one process, against hand-computed tiny references."""

import pytest
import torch

from decentrain.algorithms.diloco import DiLoCo, DiLoCoConfig, StreamingDiLoCo, StreamingDiLoCoConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig, SGDConfig
from decentrain.algorithms.outer.quantized_mean import check_quantization_backend, codec_for
from decentrain.core.comm.dist_transport import TorchTransport
from decentrain.core.world import World


class TwoLayer(torch.nn.Module):
    """Named like an HF Llama so the strided fragment split applies."""

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"num_hidden_layers": 2})()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Linear(1, 1, bias=False) for _ in range(2)])
        for i, layer in enumerate(self.model.layers):
            layer.weight.data.fill_(float(i + 1))  # layer 0: 1.0, layer 1: 2.0


def step_to(algo, model, values, step):
    for layer, v in zip(model.model.layers, values):
        layer.weight.data.fill_(v)
    return algo.after_optimizer_step(step, model, None)


def test_h_below_one_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="algorithm.inner_steps=0"):
        DiLoCoConfig(inner_steps=0)
    with pytest.raises(ValueError, match="algorithm.overlap_steps"):
        StreamingDiLoCoConfig(inner_steps=4, overlap_steps=4)
    with pytest.raises(
        ValueError, match="algorithm.outer_optimizer.nesterov=true needs algorithm.outer_optimizer.momentum"
    ):
        DiLoCoConfig(outer_optimizer=SGDConfig(momentum=0.0, nesterov=True))
    with pytest.raises(ValueError, match="algorithm.quantization='int8'.*allowed"):
        StreamingDiLoCoConfig(quantization="int8")


def test_diloco_outer_step_is_nesterov_on_the_pseudo_gradient():
    model = TwoLayer()
    algo = DiLoCo(DiLoCoConfig(inner_steps=2, outer_optimizer=OuterOptimizerConfig(lr=0.5, momentum=0.9)), World())
    algo.on_train_start(model, None)
    assert step_to(algo, model, [0.0, 1.0], 1) == {}  # inner step: no sync yet
    metrics = step_to(algo, model, [0.0, 1.0], 2)  # Δ = (1, 1); b = Δ; φ = φ − 0.5·(Δ + 0.9·b) = φ − 0.95
    assert metrics["outer/payload_bytes"] == 8  # two fp32 parameters
    assert [layer.weight.item() for layer in model.model.layers] == pytest.approx([0.05, 1.05])
    step_to(algo, model, [0.05, 1.05], 3)
    step_to(algo, model, [0.05, 1.05], 4)  # Δ = 0: b = 0.9, φ −= 0.5·(0 + 0.81)
    assert model.model.layers[0].weight.item() == pytest.approx(0.05 - 0.405)


def test_streaming_fragments_sync_in_turn_late_by_tau_and_mix_with_alpha():
    model = TwoLayer()
    cfg = StreamingDiLoCoConfig(
        inner_steps=4,
        num_fragments=2,
        overlap_steps=1,
        mix_alpha=0.5,
        outer_optimizer=SGDConfig(lr=1.0, momentum=0.0, nesterov=False),
    )
    algo = StreamingDiLoCo(cfg, World())
    algo.on_train_start(model, None)
    assert algo.offsets == [0, 2]  # fragment 1 (layer 1) at steps ≡ 2, fragment 0 at ≡ 0 (mod 4)
    step_to(algo, model, [0.0, 0.0], 1)
    assert step_to(algo, model, [0.0, 0.0], 2)["outer/payload_bytes"] == 4  # fragment 1 sends Δ = 2 − 0 = 2
    assert model.model.layers[1].weight.item() == 0.0  # τ = 1: not applied yet
    metrics = step_to(algo, model, [0.0, -1.0], 3)  # lands: φ1 = 2 − 2 = 0; θ1 = 0.5·(−1) + 0.5·0
    assert "outer/fragment_1" in metrics
    assert model.model.layers[1].weight.item() == pytest.approx(-0.5)
    assert model.model.layers[0].weight.item() == 0.0  # fragment 0 untouched
    step_to(algo, model, [3.0, -0.5], 4)  # fragment 0 sends Δ = 1 − 3 = −2
    step_to(algo, model, [5.0, -0.5], 5)  # φ0 = 1 + 2 = 3; θ0 = 0.5·5 + 0.5·3 = 4
    assert model.model.layers[0].weight.item() == pytest.approx(4.0)


def test_streaming_state_round_trips_with_a_mean_in_flight():
    cfg = StreamingDiLoCoConfig(inner_steps=4, num_fragments=2, overlap_steps=2)
    a_model, a = TwoLayer(), StreamingDiLoCo(cfg, World())
    a.on_train_start(a_model, None)
    step_to(a, a_model, [0.5, 0.5], 2)  # fragment 1 in flight, due at step 4
    state = a.state_dict()
    b_model, b = TwoLayer(), StreamingDiLoCo(cfg, World())
    b_model.load_state_dict(a_model.state_dict())
    b.load_state_dict(state)
    b.on_train_start(b_model, None)
    for step in (3, 4, 5, 6):
        step_to(a, a_model, [0.1 * step, 0.2 * step], step)
        step_to(b, b_model, [0.1 * step, 0.2 * step], step)
    assert torch.equal(a_model.model.layers[1].weight, b_model.model.layers[1].weight)
    assert torch.equal(a_model.model.layers[0].weight, b_model.model.layers[0].weight)


def test_fragments_must_cover_the_model():
    model = TwoLayer()
    cfg = StreamingDiLoCoConfig(inner_steps=4, num_fragments=2, fragments=[["model.layers.0.weight"], []])
    with pytest.raises(ValueError, match="algorithm.fragments.*do not cover"):
        StreamingDiLoCo(cfg, World()).on_train_start(model, None)


def test_quantisation_needs_a_backend_that_can_gather_packed_buffers():
    check_quantization_backend("int4", "gloo")
    check_quantization_backend("none", "mpi")
    with pytest.raises(ValueError, match="algorithm.quantization='fp16'.*'mpi'"):
        check_quantization_backend("fp16", "mpi")


@pytest.mark.parametrize("kind,tol", [("none", 0.0), ("fp16", 1e-3), ("int4", 0.05)])
def test_single_replica_mean_is_the_payload_up_to_quantisation(kind, tol):
    ts = [torch.linspace(-1, 1, 300).view(3, 100), torch.tensor([0.25])]
    out = TorchTransport(World()).start_mean(ts, codec_for(kind)).result()
    assert [o.dtype for o in out] == [torch.float32] * 2
    for o, t in zip(out, ts):
        assert o.shape == t.shape and torch.allclose(o, t, atol=tol)


def test_payload_bytes_count_what_this_replica_puts_on_the_wire():
    ts = [torch.linspace(-1, 1, 300).view(3, 100), torch.tensor([0.25])]
    tp = TorchTransport(World())
    assert tp.start_mean(ts).payload_bytes == 301 * 4
    fp16, int4 = (tp.start_mean(ts, codec_for(kind)).payload_bytes for kind in ("fp16", "int4"))
    assert 301 * 2 <= fp16 < 301 * 4 and int4 < fp16  # the encoded parts, scales included
