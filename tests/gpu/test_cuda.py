"""CUDA / nccl paths; skipped without a GPU (CI has none)."""

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = pytest.mark.gpu


def test_tiny_model_trains_a_step_on_cuda():
    from decentrain.models.factory import ModelConfig, build_model

    model = build_model(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)).cuda()
    ids = torch.randint(3, 200, (2, 16), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert loss.isfinite()


def _nccl_all_reduce(world):
    import torch.distributed as dist

    t = torch.ones(4, device=world.device) * (world.rank + 1)
    dist.all_reduce(t)
    return world.backend, t.tolist()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_world_picks_nccl_on_gpu():
    results = run_ranks(_nccl_all_reduce, 2, backend="nccl")
    assert all(b == "nccl" and t == [3.0] * 4 for b, t in results)
