"""The exchange's body checks: the checksum sees every byte, and the finite check misses nothing."""

import torch

from decentrain.core.comm.wire import _MASK, all_finite, checksum


def test_checksum_is_the_wrapping_sum_of_8_byte_words_plus_the_tail_bytes():
    t = torch.tensor([2**62, 2**62, 2**62, 2**62, 7], dtype=torch.int64)  # the word sum wraps past 2**63
    tail = torch.tensor([1, 2, 3], dtype=torch.uint8)
    expected = (sum(int(v) for v in t) + 1 + 2 + 3) % 2**64 & _MASK  # two's complement wrap, then the mask
    assert int(checksum([t, tail])) == expected


def test_one_flipped_bit_anywhere_changes_the_checksum():
    torch.manual_seed(0)
    flat = torch.randn(1001)  # 4004 bytes: 500 words and a 4-byte tail
    base = int(checksum([flat]))
    raw = flat.view(torch.uint8)
    for pos in (0, 7, 2000, 4000, 4003):  # the first word, inside words, and the tail
        hit = raw.clone()
        hit[pos] ^= 0x10
        assert int(checksum([hit.view(torch.float32)])) != base, pos


def test_a_view_at_an_odd_offset_gives_the_same_checksum_as_its_copy():
    big = torch.randn(101)
    view = big[1:]  # storage offset 4 bytes: cannot be read as 8-byte words in place
    assert int(checksum([view])) == int(checksum([view.clone()]))


def test_all_finite_finds_nan_and_inf_anywhere_and_survives_an_overflowing_sum():
    x = torch.ones(10_000)
    assert all_finite(x)
    for bad in (float("nan"), float("inf"), float("-inf")):
        for pos in (0, 5_000, 9_999):
            y = x.clone()
            y[pos] = bad
            assert not all_finite(y)
    huge = torch.full((100,), 3e38)  # every value finite, their sum is inf
    assert all_finite(huge)
    assert not all_finite(torch.tensor([float("inf"), float("-inf")]))  # a sum of NaN, not a finite 0
    assert all_finite(torch.ones(4, dtype=torch.bfloat16) * 6e4) and all_finite(torch.arange(5))
