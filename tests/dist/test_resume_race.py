"""A restart inside the same processes (a preempted run, then its resume) must not judge a step
that another rank is still saving: the resume waits for it, and takes it.

Issue 44: under load, rank 0 finished its `stop_at` save and listed the checkpoints while rank 1
was still writing its own, found no step complete on every rank, and both stopped with the
"storage that all ranks share" error. Here rank 1's save is held, deterministically, just before
it publishes its dir, until rank 0 has reached its first collective of the resume: whatever rank
0 read of the checkpoints before that collective, it read with rank 1's newest step unfinished.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import decentrain.core.checkpoint as checkpoint
from decentrain.testing import run_ranks

pytestmark = pytest.mark.dist

RESUMING = "test_resume_race/rank0_resuming"  # set by rank 0 at its first collective of the resume


def _signal_at_first_collective(store) -> None:
    """Rank 0: the first collective it enters sets RESUMING (it cannot go further without rank 1)."""
    for name in ("all_reduce", "barrier"):
        real = getattr(dist, name)

        def wrapped(*args, _real=real, **kwargs):
            store.set(RESUMING, "1")
            return _real(*args, **kwargs)

        setattr(dist, name, wrapped)


def _publish_after_rank0_resumes(store) -> None:
    """Rank 1: its save writes and syncs everything, then waits for RESUMING before the rename
    that makes its dir visible: its newest checkpoint is unfinished while rank 0 starts."""
    real = checkpoint.os.replace

    def held(src, dst):
        store.wait([RESUMING])  # the store's timeout turns a deadlock into a failure, not a hang
        return real(src, dst)

    checkpoint.os.replace = held


def _preempt_then_resume(world, root, older_step):
    ck = checkpoint.Checkpointer(Path(root), world.rank, world.world_size, keep=3)
    if older_step:  # the preempted run saved once before its last step
        ck.save(2, {"w": torch.full((4,), 2.0)})
        world.barrier()  # test set-up: step 2 complete everywhere before the race begins
    if world.rank == 0:
        ck.save(3, {"w": torch.full((4,), 3.0)})  # the stop_at save returns...
        _signal_at_first_collective(world.store)
    else:
        _publish_after_rank0_resumes(world.store)
        ck.save(3, {"w": torch.full((4,), 3.0)})  # ...while this one is still unpublished
    try:  # the resume, in the same processes, with nothing in between (as the preempted-run tests)
        step = ck.agree_resume_step(world)
    except RuntimeError as e:
        return f"RuntimeError: {e}"
    return step, float(ck.load(step)["w"][0]) if step is not None else None


@pytest.mark.parametrize("older_step", [False, True], ids=["only_step_3", "steps_2_and_3"])
def test_resume_waits_for_a_rank_still_saving_and_takes_its_newest_step(tmp_path, older_step):
    # at 78c329b: only_step_3 -> both ranks raise the shared-storage error; steps_2_and_3 -> both
    # quietly resume from step 2, one step behind the checkpoint that was being published
    assert run_ranks(_preempt_then_resume, 2, str(tmp_path), older_step) == [(3, 3.0), (3, 3.0)]
