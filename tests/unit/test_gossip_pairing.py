import numpy as np
import pytest
import torch

from decentrain.core.comm.pairing import gossip_groups, group_of
from decentrain.core.comm.wire import flatten_buckets


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_pairing_is_a_perfect_matching_and_identical_on_every_rank(n):
    for t in range(20):
        groups = gossip_groups(t, n, seed=3)
        assert sorted(r for g in groups for r in g) == list(range(n))
        assert all(len(g) == 2 for g in groups)
        assert groups == gossip_groups(t, n, seed=3)  # what every rank derives alone


def official_noloco_groups(step: int, world_size: int) -> list[tuple[int, ...]]:
    """The official NoLoCo code's pairing, written out: at the inner step `step` that ends a sync
    it draws `default_rng(step + 1).permutation(N)` and deals it round-robin into N/2 pairs."""
    perm = [int(x) for x in np.random.default_rng(step + 1).permutation(world_size)]
    n = world_size // 2
    out = [[] for _ in range(n)]
    for i, x in enumerate(perm):
        out[i % n].append(x)
    return [tuple(g) for g in out]


@pytest.mark.parametrize("h", [1, 50, 100])
@pytest.mark.parametrize("n", [4, 8, 16])
def test_seed_none_reproduces_the_official_partner_sequence(h, n):
    # the k-th sync (k = 1, 2, ...) happens after inner step k*H; decentrain's round index is k - 1
    for k in range(1, 201):
        assert gossip_groups(k - 1, n, inner_steps=h) == official_noloco_groups(k * h, n)


def test_reference_pairing_needs_the_inner_step_count():
    with pytest.raises(ValueError, match="inner_steps"):
        gossip_groups(0, 4)
    assert gossip_groups(0, 4, seed=5) == gossip_groups(0, 4, seed=5, inner_steps=50)  # a seeded stream ignores H


def test_partners_change_across_rounds():
    partners = {group_of(0, gossip_groups(t, 8, seed=0)) for t in range(30)}
    assert len(partners) > 3


def test_odd_world_policies():
    with pytest.raises(ValueError, match="odd"):
        gossip_groups(0, 5, seed=1)
    idle = gossip_groups(0, 5, seed=1, odd="idle")
    assert sorted(len(g) for g in idle) == [1, 2, 2]
    triple = gossip_groups(0, 5, seed=1, odd="triple")
    assert sorted(len(g) for g in triple) == [2, 3]
    assert sorted(r for g in triple for r in g) == list(range(5))
    with pytest.raises(ValueError, match="allowed"):
        gossip_groups(0, 4, seed=1, odd="bogus")


def test_buckets_respect_size_and_order():
    ts = [torch.zeros(10), torch.zeros(10), torch.zeros(100), torch.zeros(5)]
    buckets = flatten_buckets(ts, bucket_bytes=80)
    assert buckets == [[0, 1], [2], [3]]


def test_buckets_never_mix_dtypes():
    ts = [
        torch.zeros(4, dtype=torch.bfloat16),
        torch.zeros(4, dtype=torch.bfloat16),
        torch.zeros(2),
        torch.zeros(4, dtype=torch.bfloat16),
    ]
    assert flatten_buckets(ts, bucket_bytes=1 << 20) == [[0, 1], [2], [3]]
