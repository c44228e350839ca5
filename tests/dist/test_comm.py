import time

import pytest
import torch

from dist_helpers import run_ranks

from decentrain.core.bytes_comm import all_gather_bytes, broadcast_bytes
from decentrain.core.ensemble import ExpertPlacement, gather_expert_logprobs
from decentrain.core.gossip import PairExchange, gossip_groups, group_of

pytestmark = pytest.mark.dist


def _pair_average(world, rounds):
    ex = PairExchange(world, bucket_bytes=64)  # tiny buckets: several messages per round
    out = []
    for t in range(rounds):
        mine = [torch.full((5,), float(world.rank + 10 * t)), torch.arange(30, dtype=torch.float32) * world.rank]
        group = group_of(world.rank, gossip_groups(t, world.world_size, seed=7))
        out.append((group, [x.tolist() for x in ex.average(mine, group, t)]))
    return out


def test_pair_exchange_returns_the_partner_mean_on_4_ranks():
    results = run_ranks(_pair_average, 4, 3)
    for rank, rounds in enumerate(results):
        for t, (group, (a, b)) in enumerate(rounds):
            assert rank in group and len(group) == 2
            assert a == [sum(r + 10 * t for r in group) / 2] * 5
            assert b == [i * sum(group) / 2 for i in range(30)]


def _late_partner(world):
    ex = PairExchange(world, deadline_s=0.5)
    group = (0, 1)
    if world.rank == 1:
        time.sleep(1.5)  # misses round 0's deadline
    r0 = ex.average([torch.full((4,), float(world.rank))], group, round_idx=0)
    if world.rank == 0:
        time.sleep(1.5)  # let the late message land in round 0's orphaned buffer
    r1 = ex.average([torch.full((4,), float(world.rank) + 2)], group, round_idx=1)
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
    from decentrain.core.bytes_comm import PayloadTooLarge

    data = b"y" * (100 if world.rank == 1 else 3)
    try:
        return all_gather_bytes(world, data, max_bytes=10)
    except PayloadTooLarge:
        return "raised"


def test_an_oversized_payload_raises_on_its_sender_only_and_nobody_hangs():
    results = run_ranks(_oversized, 3)
    assert results[1] == "raised"
    assert results[0] == results[2] == [b"yyy", b"", b"yyy"]
