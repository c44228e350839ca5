"""All ranks resume from the same step: the newest one intact on every rank, or a clear stop."""

from pathlib import Path

import pytest
import torch

from decentrain.testing import run_ranks

from decentrain.core.checkpoint import Checkpointer

pytestmark = pytest.mark.dist


def _agree(world, root, local_disks):
    base = Path(root) / (f"node{world.rank}" if local_disks else "shared")
    ck = Checkpointer(base, world.rank, world.world_size, keep=3)
    for step in (10, 20):
        ck.save(step, {"w": torch.full((4,), float(step))})
    if world.rank == 1 and not local_disks:  # rank 1's newest step is damaged; rank 0's is fine
        (base / "step_00000020" / "rank_1" / "tensors.safetensors").write_bytes(b"")
    # A resume reads what every rank wrote before the restart: without this barrier a loaded box let
    # rank 0 look before rank 1 had saved (or damaged) its files, and agree on nothing
    torch.distributed.barrier()
    return _try(ck, world)  # on node-local disks, neither rank sees the other's files


def _try(ck, world):
    try:
        return ck.agree_resume_step(world)
    except RuntimeError as e:
        return str(e)


def test_ranks_agree_on_the_newest_step_good_everywhere(tmp_path):
    assert run_ranks(_agree, 2, str(tmp_path), False) == [10, 10]  # rank 0 alone would have taken 20


def test_node_local_checkpoints_stop_with_a_shared_storage_message_not_a_restart_from_zero(tmp_path):
    for msg in run_ranks(_agree, 2, str(tmp_path), True):
        assert isinstance(msg, str) and "storage that all ranks share" in msg
