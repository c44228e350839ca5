import numpy as np
import pytest
import torch

from decentrain.core.gossip import flatten_buckets, gossip_groups, group_of


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_pairing_is_a_perfect_matching_and_identical_on_every_rank(n):
    for t in range(20):
        groups = gossip_groups(t, n, seed=3)
        assert sorted(r for g in groups for r in g) == list(range(n))
        assert all(len(g) == 2 for g in groups)
        assert groups == gossip_groups(t, n, seed=3)  # what every rank derives alone


def test_seed_none_is_the_noloco_reference():
    n, t = 8, 5
    perm = np.random.default_rng(t + 1).permutation(n)
    expected = [(int(perm[j]), int(perm[j + n // 2])) for j in range(n // 2)]
    assert gossip_groups(t, n) == expected


def test_partners_change_across_rounds():
    partners = {group_of(0, gossip_groups(t, 8, seed=0)) for t in range(30)}
    assert len(partners) > 3


def test_odd_world_policies():
    with pytest.raises(ValueError, match="odd"):
        gossip_groups(0, 5)
    idle = gossip_groups(0, 5, seed=1, odd="idle")
    assert sorted(len(g) for g in idle) == [1, 2, 2]
    triple = gossip_groups(0, 5, seed=1, odd="triple")
    assert sorted(len(g) for g in triple) == [2, 3]
    assert sorted(r for g in triple for r in g) == list(range(5))
    with pytest.raises(ValueError, match="allowed"):
        gossip_groups(0, 4, odd="bogus")


def test_buckets_respect_size_and_order():
    ts = [torch.zeros(10), torch.zeros(10), torch.zeros(100), torch.zeros(5)]
    buckets = flatten_buckets(ts, bucket_bytes=80)
    assert buckets == [[0, 1], [2], [3]]


def test_buckets_never_mix_dtypes():
    ts = [torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16), torch.zeros(2), torch.zeros(4, dtype=torch.bfloat16)]
    assert flatten_buckets(ts, bucket_bytes=1 << 20) == [[0, 1], [2], [3]]
