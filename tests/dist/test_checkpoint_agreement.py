"""All ranks resume from the same step: the newest one complete and intact on every rank; with
none, a fresh start said in one line; a stop only where the ranks' views prove the storage is
not shared."""

import logging
from pathlib import Path

import pytest
import torch

from decentrain.core.checkpoint import Checkpointer
from decentrain.testing import run_ranks

pytestmark = pytest.mark.dist


def _save(ck, *steps):
    for step in steps:
        ck.save(step, {"w": torch.full((4,), float(step))})


def _unfinished(ck, step):
    """What a save killed mid-write leaves: a temp dir with part of the files, no rank dir."""
    tmp = ck.step_dir(step) / f".tmp-rank_{ck.rank}-12345"
    tmp.mkdir(parents=True)
    (tmp / "tensors.safetensors").write_bytes(b"\0" * 10)


def _damaged_newest(ck, world):  # rank 1's newest step is damaged; rank 0's is fine
    _save(ck, 10, 20)
    if world.rank == 1:
        (ck.step_dir(20) / "rank_1" / "tensors.safetensors").write_bytes(b"")


def _unfinished_newest(ck, world):  # preempted while rank 1 was writing step 30
    _save(ck, 10, 20)
    _unfinished_only(ck, world)


def _unfinished_only(ck, world):  # preempted during the first save, which rank 1 never finished
    if world.rank == 0:
        _save(ck, 30)
    else:
        _unfinished(ck, 30)


def _node_local(ck, world):  # each rank writes under its own root: neither sees the other's files
    _save(ck, 10, 20)


def _node_local_one_rank(ck, world):  # node-local disks, and only rank 0 ever saved
    if world.rank == 0:
        _save(ck, 10)


CASES = {  # name: (set-up, one root per rank)
    "damaged_newest": (_damaged_newest, False),
    "unfinished_newest": (_unfinished_newest, False),
    "unfinished_only": (_unfinished_only, False),
    "node_local": (_node_local, True),
    "node_local_one_rank": (_node_local_one_rank, True),
}


def _agree(world, root, case):
    setup, local_disks = CASES[case]
    ck = Checkpointer(
        Path(root) / (f"node{world.rank}" if local_disks else "shared"), world.rank, world.world_size, keep=3
    )
    setup(ck, world)
    # No barrier here: a resume in the same processes meets the other ranks before it lists
    # anything (under tests/stress.sh rank 0 used to list before rank 1 had saved or damaged)
    lines = _Lines(logging.WARNING)
    logging.getLogger("decentrain.core.checkpoint").addHandler(lines)
    try:
        return ck.agree_resume_step(world), lines.messages
    except RuntimeError as e:
        return str(e), lines.messages


class _Lines(logging.Handler):
    def __init__(self, level):
        super().__init__(level)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_ranks_agree_on_the_newest_step_good_everywhere(tmp_path):
    (step0, _), (step1, _) = run_ranks(_agree, 2, str(tmp_path), "damaged_newest")
    assert step0 == step1 == 10  # rank 0 alone would have taken 20


def test_a_step_one_rank_left_unfinished_falls_back_to_the_one_before(tmp_path):
    (step0, lines0), (step1, lines1) = run_ranks(_agree, 2, str(tmp_path), "unfinished_newest")
    assert step0 == step1 == 20 and lines0 == lines1 == []


def test_no_step_complete_on_every_rank_starts_afresh_in_one_line_not_with_a_storage_error(tmp_path):
    (step0, lines0), (step1, lines1) = run_ranks(_agree, 2, str(tmp_path), "unfinished_only")
    assert step0 is None and step1 is None
    assert len(lines0) == 1 and "starting afresh" in lines0[0] and "step 30" in lines0[0] and lines1 == []


def test_node_local_checkpoints_stop_with_a_shared_storage_message_not_a_restart_from_zero(tmp_path):
    for msg, _ in run_ranks(_agree, 2, str(tmp_path), "node_local"):
        assert isinstance(msg, str) and "storage that all ranks share" in msg


def test_node_local_files_on_one_rank_only_start_afresh(tmp_path):
    # nothing to resume on rank 1 in any case; the storage error needs files on every rank
    (step0, lines0), (step1, _) = run_ranks(_agree, 2, str(tmp_path), "node_local_one_rank")
    assert step0 is None and step1 is None and len(lines0) == 1 and "starting afresh" in lines0[0]
