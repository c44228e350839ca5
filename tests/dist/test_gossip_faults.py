"""PairExchange against dead and lying partners: each case once crashed, hung or averaged garbage."""

import os
import select
import signal
import time

import pytest
import torch
import torch.distributed as dist

from decentrain.core.comm.pair_exchange import PairExchange
from decentrain.core.comm.pairing import gossip_groups, group_of
from decentrain.core.comm.wire import Tags, make_header
from decentrain.testing import average, run_ranks

pytestmark = pytest.mark.dist


def _liar_sends(world, round_idx, flats, edit=None):
    """What a hostile rank 1 puts on the wire: a (possibly edited) header, then the body."""
    flats = [torch.cat(flats)]  # one bucket, as the honest side's 32 MB buckets pack both tensors
    header = make_header(round_idx, flats, torch.device("cpu"))
    if edit:
        edit(header)
    works = [dist.isend(header, dst=0, tag=Tags.header(round_idx))]
    works += [dist.isend(f, dst=0, tag=tag) for tag, f in zip(Tags.buckets(round_idx, len(flats)), flats)]
    return works


def _hostile(world, case):
    # only the headerless body must time out (rank 0's round 0); every other wait is long, so a rank
    # that a loaded box holds back for seconds is still waited for
    ex = PairExchange(world, deadline_s=3.0 if case == "no_header" and world.rank == 0 else 60.0)
    honest = [torch.full((4,), 1.0), torch.arange(3.0)]
    if world.rank == 0:
        first = average(ex, honest, (0, 1), 0)
        second = average(ex, honest, (0, 1), 1)  # the next round with an honest partner still works
        st = ex.stats
        return (
            first,
            None if second is None else [t.tolist() for t in second],
            (st.rejected, st.corrupt, st.nonfinite, st.timeouts, st.skipped),
        )
    if case == "bigger":  # 1000 floats where 4 are expected: gloo used to terminate the receiver
        works = _liar_sends(world, 0, [torch.ones(1000), torch.arange(3.0)])
    elif case == "smaller":  # 2 floats where 4 are expected: the receiver used to average uninitialised memory
        works = _liar_sends(world, 0, [torch.ones(2), torch.arange(3.0)])
    elif case == "nan":
        works = _liar_sends(world, 0, [torch.full((4,), float("nan")), torch.arange(3.0)])
    elif case == "checksum":
        works = _liar_sends(
            world, 0, [torch.full((4,), 5.0), torch.arange(3.0)], edit=lambda h: h.__setitem__(6, 12345)
        )
    elif case == "wrong_round":  # a replayed or lagging round
        works = _liar_sends(world, 0, [torch.full((4,), 5.0), torch.arange(3.0)], edit=lambda h: h.__setitem__(2, 99))
    elif case == "no_header":  # an old-protocol sender: a body with no header never reaches a receive buffer
        works = [dist.isend(torch.ones(1000), dst=0, tag=0)]
    else:
        raise ValueError(case)
    time.sleep(0.2)
    out = average(ex, [torch.full((4,), 3.0), torch.arange(3.0)], (0, 1), 1)
    del works
    return None if out is None else [t.tolist() for t in out]


@pytest.mark.parametrize(
    "case,counter", [("bigger", 0), ("smaller", 0), ("nan", 2), ("checksum", 1), ("wrong_round", 0)]
)
def test_a_bad_partner_message_is_dropped_and_counted_not_crashed_or_averaged(case, counter):
    (first, second, counts), liar_round1 = run_ranks(_hostile, 2, case)
    assert first is None  # this round's mix skipped: nothing of the bad message was averaged
    assert counts[counter] == 1 and sum(counts) == 1
    assert second == [[2.0] * 4, [0.0, 1.0, 2.0]]  # round 1 with the partner honest again averages normally
    assert liar_round1 == second


def test_a_body_without_header_times_out_and_the_next_round_is_skipped_not_waited_for():
    (first, second, counts), liar_round1 = run_ranks(_hostile, 2, "no_header")
    assert first is None and counts[3] == 1  # round 0: deadline, no crash on the 1000-float body
    assert second is None and liar_round1 is None and counts[4] == 1  # round 1: both learn of the skip at once


def _exited(pid: int, timeout_s: float = 120.0) -> bool:
    """Wait for `pid` (a sibling rank, not our child) to exit: its pidfd turns readable once the kernel has
    closed the process's files, its gloo sockets included (an event, not a sleep)."""
    fd = os.pidfd_open(pid)
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _one_dies(world, rounds, kill_after, deadline):
    ex = PairExchange(world, deadline_s=deadline).full_duplex()
    done = []
    for t in range(rounds):
        if t == kill_after:
            # every rank has finished the rounds before (rank 3's last sends included): it dies between rounds
            if world.rank == 3:
                world.store.set("rank3_pid", str(os.getpid()))
            dist.barrier(group=world.group)
            if world.rank == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            # and is dead, its sockets closed, before anyone's next round. Else a survivor may post to it before
            # it is gone (a dying process closes its files only after unmapping its memory, slow on a loaded
            # box): if that wait ends at the 5 s deadline, the survivor enters its next round a deadline
            # late, and a healthy partner who entered it on time gives up on it at the same 5 s
            assert _exited(int(world.store.get("rank3_pid")))
        group = group_of(world.rank, gossip_groups(t, world.world_size, seed=3))
        out = average(ex, [torch.full((8,), float(world.rank))], group, t)
        done.append((group, out is None))
    return done, ex.stats.failures, ex.stats.timeouts


@pytest.mark.parametrize("deadline", [None, 5.0])
def test_survivors_of_a_sigkilled_partner_keep_averaging_with_the_others(deadline):
    results = run_ranks(_one_dies, 4, 8, 1, deadline, expect_dead=(3,))
    for rank in (0, 1, 2):
        done, failures, timeouts = results[rank]
        assert len(done) == 8  # every round ran: the dead partner cost rounds, not the run
        for t, (group, missed) in enumerate(done):
            assert missed == (3 in group and t >= 1)  # exactly the rounds paired with the dead rank are lost
        lost = sum(3 in g for g, _ in done[1:])
        # the dead rank's socket error usually arrives first; on a loaded box the 5 s deadline may expire first
        assert failures + timeouts == lost and (deadline is not None or timeouts == 0)
