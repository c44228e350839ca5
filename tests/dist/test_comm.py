import pytest
import torch

from decentrain.core.comm.bytes_comm import all_gather_bytes, broadcast_bytes
from decentrain.core.comm.ensemble import ExpertPlacement, gather_expert_logprobs
from decentrain.core.comm.pair_exchange import PairExchange
from decentrain.core.comm.pairing import gossip_groups, group_of
from decentrain.testing import average, run_ranks

pytestmark = pytest.mark.dist


def _pair_average(world, rounds):
    ex = PairExchange(world, bucket_bytes=64)  # tiny buckets: several messages per round
    out = []
    for t in range(rounds):
        mine = [torch.full((5,), float(world.rank + 10 * t)), torch.arange(30, dtype=torch.float32) * world.rank]
        group = group_of(world.rank, gossip_groups(t, world.world_size, seed=7))
        out.append((group, [x.tolist() for x in average(ex, mine, group, t)]))
    return out


def test_pair_exchange_returns_the_partner_mean_on_4_ranks():
    results = run_ranks(_pair_average, 4, 3)
    for rank, rounds in enumerate(results):
        for t, (group, (a, b)) in enumerate(rounds):
            assert rank in group and len(group) == 2
            assert a == [sum(r + 10 * t for r in group) / 2] * 5
            assert b == [i * sum(group) / 2 for i in range(30)]


def _late_partner(world):
    """Rank 1 is late for round 0: it enters it only once rank 0 has given up on it (a store key, not a
    sleep: on a loaded box a sleeping rank can still be first), and rank 0 enters round 1 only once
    rank 1's late round-0 message has landed in rank 0's orphaned buffer (`drain`, an event)."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    ex = PairExchange(world, deadline_s=0.5 if world.rank == 0 else 60.0)  # only rank 0's deadline is under test
    group = (0, 1)
    if world.rank == 1:
        store.wait(["rank0_gave_up_round0"])
    r0 = average(ex, [torch.full((4,), float(world.rank))], group, round_idx=0)
    if world.rank == 0:
        store.set("rank0_gave_up_round0", "1")
        store.wait(["rank1_sent_round0"])
        # rank 1 returning from round 0 means its send completed, not that rank 0's receiver thread has
        # seen it yet (CI once caught rank 0 one step early): wait on that event, not on luck
        assert ex.drain(60.0)
    else:
        store.set("rank1_sent_round0", "1")
    ex.deadline_s = 60.0  # round 1 must succeed on both sides, whenever each enters it
    r1 = average(ex, [torch.full((4,), float(world.rank) + 2)], group, round_idx=1)
    return (None if r0 is None else r0[0].tolist()), r1[0].tolist(), ex.stats.timeouts


def test_a_late_partner_costs_one_round_not_the_run():
    (r0_a, r1_a, to_a), (r0_b, r1_b, to_b) = run_ranks(_late_partner, 2)
    assert r0_a is None and to_a == 1  # rank 0 gave up on round 0
    assert r0_b == [0.5] * 4  # rank 1 still got rank 0's round-0 buffer
    assert r1_a == r1_b == [2.5] * 4  # round 1 is not polluted by round 0's late message


def _bytes(world):
    mine = b"x" * (world.rank * 3) + bytes([world.rank])
    got = all_gather_bytes(world, mine)
    root = broadcast_bytes(world, b"hello from 0" if world.rank == 0 else None)
    return got, root


def test_byte_collectives_handle_ragged_sizes():
    results = run_ranks(_bytes, 3)
    expected = [b"x" * (r * 3) + bytes([r]) for r in range(3)]
    assert all(got == expected and root == b"hello from 0" for got, root in results)


def _experts(world, k):
    placement = ExpertPlacement(k, world.world_size)
    local = {e: torch.full((2, 3), -float(e + 1)) for e in placement.experts_on(world.rank)}
    return gather_expert_logprobs(world, placement, local).tolist()


def test_ensemble_gather_orders_experts_across_ranks():
    results = run_ranks(_experts, 2, 3)  # rank 0 holds experts 0 and 2, rank 1 holds 1
    expected = [[[-1.0] * 3] * 2, [[-2.0] * 3] * 2, [[-3.0] * 3] * 2]
    assert results[0] == results[1] == expected


def _oversized(world):
    from decentrain.core.comm.bytes_comm import PayloadTooLarge

    data = b"y" * (100 if world.rank == 1 else 3)
    try:
        return all_gather_bytes(world, data, max_bytes=10)
    except PayloadTooLarge:
        return "raised"


def test_an_oversized_payload_raises_on_its_sender_only_and_nobody_hangs():
    results = run_ranks(_oversized, 3)
    assert results[1] == "raised"
    assert results[0] == results[2] == [b"yyy", b"", b"yyy"]


def _hostile_announcer(world):
    """Rank 1 announces 256 MiB, then 1 TiB, then plays the data round at the width honest ranks agree on."""
    import resource

    import torch.distributed as dist

    cap = 1 << 20
    out = []
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    for announced in (256 << 20, 1 << 40):
        if world.rank == 1:  # hand-rolled sender: lies about its size, then follows the protocol
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world.world_size)]
            dist.all_gather(sizes, torch.tensor([announced], dtype=torch.int64), group=world.group)
            width = max(int(s) for s in sizes if int(s) <= cap)  # what honest ranks must agree on
            bufs = [torch.empty(width, dtype=torch.uint8) for _ in range(world.world_size)]
            dist.all_gather(bufs, torch.zeros(width, dtype=torch.uint8), group=world.group)
            out.append("hostile")
        else:
            got = all_gather_bytes(world, bytes([65 + world.rank]) * 10, max_bytes=cap)
            out.append((list(got), got.dropped))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0) / 1024
    after = all_gather_bytes(world, b"ok%d" % world.rank, max_bytes=cap)  # the group still works
    return out, grown_mib, list(after)


def test_an_over_cap_announcement_is_dropped_before_allocating_and_nobody_raises():
    results = run_ranks(_hostile_announcer, 3)
    for rank in (0, 2):
        out, grown_mib, after = results[rank]
        for got, dropped in out:  # 256 MiB, then 1 TiB: same outcome, no exception
            assert got == [b"A" * 10, b"", b"C" * 10] and dropped == [1]
        assert grown_mib < 64, f"rank {rank} peak RSS grew {grown_mib:.0f} MiB"
        assert after == [b"ok0", b"ok1", b"ok2"]
