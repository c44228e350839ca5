"""PairExchange over 4 gloo ranks with one process group per direction (full duplex)."""

import pytest
import torch

from decentrain.core.comm.pair_exchange import PairExchange
from decentrain.core.comm.pairing import gossip_groups, group_of
from decentrain.testing import average, run_ranks

pytestmark = pytest.mark.dist


def _duplex_rounds(world, rounds):
    ex = PairExchange(world, bucket_bytes=256).full_duplex()
    out = []
    for t in range(rounds):
        group = group_of(world.rank, gossip_groups(t, world.world_size, seed=11))
        mine = [torch.full((3, 7), float(world.rank) + t), torch.arange(100.0) * (world.rank + 1)]
        a, b = average(ex, mine, group, t)
        out.append((group, a.unique().tolist(), b[:3].tolist()))
    return len(ex._lanes), out


def test_full_duplex_exchange_averages_with_the_partner_every_round():
    results = run_ranks(_duplex_rounds, 4, 4)
    for rank, (lanes, rounds) in enumerate(results):
        assert lanes == 4 * 3  # one group per ordered pair
        partners = set()
        for t, (group, a, b) in enumerate(rounds):
            assert rank in group and len(group) == 2
            partners.add(group)
            assert a == [sum(r + t for r in group) / 2]
            assert b == [i * sum(r + 1 for r in group) / 2 for i in range(3)]
        assert len(partners) > 1  # the matching changes between rounds


def _triple(world):
    ex = PairExchange(world).full_duplex()
    groups = gossip_groups(0, world.world_size, seed=2, odd="triple")
    group = group_of(world.rank, groups)
    return group, average(ex, [torch.tensor([float(world.rank)])], group, 0)[0].item()


def test_odd_world_triple_averages_three_ranks():
    results = run_ranks(_triple, 3)
    for group, value in results:
        assert len(group) == 3 and value == pytest.approx(1.0)


def _duplex_deadline(world):
    # rank 0 gives up on round 0 (its 1 s deadline); rank 1 enters round 0 only then and completes it from
    # rank 0's posted sends; rank 0 enters round 1 only once rank 1 is through round 0 and rank 1's late
    # round-0 message has reached it (else it would still be owed and round 1 skipped). Store keys order
    # the ranks, not sleeps: on a loaded box a sleeping rank can still arrive first. Only rank 0's
    # round-0 deadline is under test; every other wait is long.
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    ex = PairExchange(world, deadline_s=1.0 if world.rank == 0 else 60.0).full_duplex()
    if world.rank == 1:
        store.wait(["rank0_gave_up_round0"])
    r0 = average(ex, [torch.ones(4) * world.rank], (0, 1), 0)
    if world.rank == 0:
        store.set("rank0_gave_up_round0", "1")
        store.wait(["rank1_done_round0"])
        # rank 1 being through round 0 does not mean its round-0 message was consumed here yet
        # (this rank's receive thread may still be on it): else round 1 is skipped as still owed
        assert ex.drain(60.0)
    else:
        store.set("rank1_done_round0", "1")
    ex.deadline_s = 60.0
    r1 = average(ex, [torch.ones(4) * (world.rank + 2)], (0, 1), 1)
    return r0 is None, r1[0].tolist()


def test_deadline_costs_one_round_in_duplex_mode_too():
    (missed0, r1_0), (missed1, r1_1) = run_ranks(_duplex_deadline, 2)
    assert missed0 and not missed1
    assert r1_0 == r1_1 == [2.5] * 4
