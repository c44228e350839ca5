"""Every algorithm's communication hands the backend tensors on world.device (meta stands in for CUDA).

See tests/device_guard.py. These fail when a CPU-built tensor (pacing times, fingerprints,
sizes) reaches a process group that would be NCCL on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from decentrain.core.world import World
from decentrain.testing import DeviceMismatch, device_guard

META = torch.device("meta")


def _world(rank: int = 0, size: int = 2, backend: str = "nccl") -> World:
    return World(rank=rank, world_size=size, device=META, backend=backend)


def _meta_model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from decentrain.models.factory import ModelConfig, build_model

    torch.manual_seed(0)
    cfg = ModelConfig(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_seq_len=32)
    return build_model(cfg).to(device=META, dtype=dtype)


def _run_rounds(algorithm, model: torch.nn.Module, steps: int) -> dict:
    metrics: dict = {}
    algorithm.on_train_start(model, None)
    for step in range(1, steps + 1):
        with torch.no_grad():  # an inner step moved the weights
            for p in model.parameters():
                p.add_(1.0)
        metrics.update(algorithm.after_optimizer_step(step, model, None))
    algorithm.on_train_end(model)
    return metrics


def test_guard_refuses_a_host_tensor_and_passes_a_device_tensor():
    with device_guard(META) as calls:
        dist.all_reduce(torch.zeros(2, device=META))
        with pytest.raises(DeviceMismatch, match="on cpu"):
            dist.all_reduce(torch.zeros(2))
        with pytest.raises(DeviceMismatch):
            dist.isend(torch.zeros(2), dst=1)
        assert torch.zeros(3, device=META).sum().item() == 0.0  # host reads of meta give zeros
    assert calls.ops == ["all_reduce", "all_reduce", "isend"]
    with device_guard(META, backend="gloo"):  # ranks sharing a GPU: gloo, p2p through host memory
        dist.all_reduce(torch.zeros(2, device=META))  # gloo's CUDA collectives work
        dist.isend(torch.zeros(2), dst=1)
        with pytest.raises(DeviceMismatch, match="gloo needs it on cpu"):
            dist.irecv(torch.zeros(2, device=META), src=1)
        side = dist.new_group([0, 1], backend="nccl")
        with pytest.raises(DeviceMismatch, match="nccl"):
            dist.all_reduce(torch.zeros(2), group=side)
    with pytest.raises(RuntimeError):  # patches are gone afterwards
        torch.zeros(1, device=META).item()


@pytest.mark.parametrize("adaptive", [False, True])
def test_diloco_outer_step_stays_on_device(adaptive):
    from decentrain.algorithms.diloco.diloco import DiLoCo, DiLoCoConfig

    model = _meta_model()
    with device_guard(META) as calls:
        metrics = _run_rounds(DiLoCo(DiLoCoConfig(inner_steps=2, adaptive_inner_steps=adaptive), _world()), model, 4)
    assert calls.ops.count("all_reduce") >= 2 + 2 * adaptive  # two outer rounds (+ the pace MIN)
    assert "all_gather" in calls.ops and "broadcast" in calls.ops  # start-up fingerprint and weights
    assert metrics["outer/round"] >= 2.0  # adaptive H hears a zero step time (meta reads) and may shorten rounds


@pytest.mark.parametrize("quantization", ["none", "fp16", "int4"])
def test_streaming_diloco_fragments_stay_on_device(quantization):
    from decentrain.algorithms.diloco.streaming import StreamingDiLoCo, StreamingDiLoCoConfig

    cfg = StreamingDiLoCoConfig(inner_steps=4, num_fragments=2, overlap_steps=1, quantization=quantization)
    with device_guard(META) as calls:
        _run_rounds(StreamingDiLoCo(cfg, _world()), _meta_model(), 8)
    op = "all_reduce" if quantization == "none" else "all_gather"
    assert calls.ops.count(op) >= 4  # 2 fragments x 2 rounds


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gamma,adaptive", [(None, False), (None, True), (0.3, False)])
def test_noloco_gossip_payload_stays_on_device(dtype, gamma, adaptive, backend):
    """The H100 findings: NoLoCo's pacing tensor was built on the CPU and sent with the weights
    (nccl); ranks sharing a GPU (gloo) must stage the pair exchange through host memory."""
    from decentrain.algorithms.noloco.noloco import NoLoCo, NoLoCoConfig

    cfg = NoLoCoConfig(inner_steps=2, gamma=gamma, adaptive_inner_steps=adaptive, full_duplex=False)
    with device_guard(META, backend) as calls:
        metrics = _run_rounds(NoLoCo(cfg, _world(backend=backend)), _meta_model(dtype), 4)
    assert metrics["outer/round"] >= 2.0  # adaptive H hears a zero step time (meta reads) and may shorten rounds
    sent = [
        devs for op, devs in calls.calls if op in ("isend", "send", "batch_isend_irecv", "all_reduce", "all_gather")
    ]
    assert sent, f"NoLoCo exchanged nothing: {calls.ops}"


def test_hdee_expert_parallel_gather_stays_on_device():
    from decentrain.core.comm.ensemble import ExpertPlacement, gather_expert_logprobs

    placement = ExpertPlacement(num_experts=3, world_size=2)
    # scorers hand host tensors in; empty rows because the agreed shape is read back from meta as zeros
    local = {k: torch.zeros(0, 0) for k in placement.experts_on(0)}
    with device_guard(META) as calls:
        out = gather_expert_logprobs(_world(0), placement, local)
    assert calls.ops == ["all_reduce", "all_gather"]
    assert out.shape[0] == 3


def test_sapo_collective_bytes_stay_on_device():
    from decentrain.core.comm.bytes_comm import agree_run_dir, all_gather_bytes, broadcast_bytes

    with device_guard(META) as calls:
        all_gather_bytes(_world(0), b'{"rollouts": []}')
        broadcast_bytes(_world(0), b"run-dir")
        broadcast_bytes(_world(1), None)
        agree_run_dir(_world(1), "/tmp/never-created")
    assert calls.ops.count("all_gather") >= 1 and calls.ops.count("broadcast") >= 4


def test_sapo_collective_exchange_stays_on_device():
    from decentrain.algorithms.sapo.exchange import CollectiveExchange, ExchangeConfig

    exchange = CollectiveExchange(ExchangeConfig(name="collective"), _world(0), "node0")
    with device_guard(META) as calls:
        exchange.exchange(0, b'{"v": 1}')
    assert calls.ops.count("all_gather") >= 1
