"""Device placement: GPUs shared round-robin, gloo when shared, impossible layouts refused in one line."""

from __future__ import annotations

import pytest
import torch

from decentrain.core.world import plan_placement


def test_cpu_pinned_ignores_gpus():
    p = plan_placement("cpu", local_ranks=2, gpus=1)
    assert (p.device_type, p.backend, p.device(1)) == ("cpu", "gloo", torch.device("cpu"))


def test_auto_without_gpu_is_cpu_gloo():
    p = plan_placement("auto", local_ranks=4, gpus=0)
    assert (p.device_type, p.backend) == ("cpu", "gloo")


def test_one_gpu_two_ranks_share_it_over_gloo():
    """The H100 finding: rank 1 of `decentrain experiment=ddp_cpu` got cuda:1 on a 1-GPU box."""
    p = plan_placement("auto", local_ranks=2, gpus=1)
    assert p.shared and p.backend == "gloo"
    assert [p.device(r) for r in range(2)] == [torch.device("cuda", 0)] * 2


def test_four_ranks_round_robin_on_two_gpus():
    p = plan_placement("cuda", local_ranks=4, gpus=2)
    assert [p.device(r).index for r in range(4)] == [0, 1, 0, 1] and p.backend == "gloo"


def test_one_rank_per_gpu_is_nccl():
    p = plan_placement("auto", local_ranks=2, gpus=8)
    assert (p.shared, p.backend, p.gpus, p.device(1)) == (False, "nccl", 2, torch.device("cuda", 1))


@pytest.mark.parametrize(
    "device,ranks,gpus,backend,words",
    [
        ("cuda", 2, 0, None, ["train.device=cuda", "2 local rank", "device_count()=0", "train.device=cpu"]),
        ("cpu", 2, 1, "nccl", ["nccl", "2 local rank", "gloo"]),
        ("cuda", 4, 2, "nccl", ["4 local ranks on 2 GPU", "at most 2"]),
        ("tpu", 1, 0, None, ["train.device='tpu'", "allowed"]),
    ],
)
def test_impossible_layouts_are_refused_naming_counts_and_fix(device, ranks, gpus, backend, words):
    with pytest.raises(ValueError) as e:
        plan_placement(device, ranks, gpus, backend)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_init_world_shares_the_gpu_under_torchrun_env(monkeypatch):
    """init_world (the one reader of torchrun's env) gives local rank 1 of 2 cuda:0 on a 1-GPU node."""
    from decentrain.core import world as world_mod

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(world_mod, "visible_gpus", lambda: 1)
    set_to = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: set_to.append(d))
    w = world_mod.init_world(device="auto")
    assert w.device == torch.device("cuda", 0) and set_to == [torch.device("cuda", 0)]
    assert world_mod.init_world(device="cpu").device == torch.device("cpu")
