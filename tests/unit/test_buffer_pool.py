"""Pooled wire buffers: reused across rounds, bounded, and packed exactly like a concatenation."""

import torch

from decentrain.core.comm.buffer_pool import BufferPool
from decentrain.core.comm.wire import flatten_buckets, pack


def test_a_given_back_buffer_is_taken_again_and_the_pool_is_bounded():
    pool = BufferPool(keep=2)
    a = pool.take(10, torch.float32, torch.device("cpu"))
    pool.give([a])
    assert pool.take(10, torch.float32, torch.device("cpu")) is a and pool.allocated == 1
    assert pool.take(10, torch.bfloat16, torch.device("cpu")) is not a  # another dtype is another shape
    bufs = [pool.take(10, torch.float32, torch.device("cpu")) for _ in range(3)]
    pool.give(bufs + [bufs[0]])  # beyond `keep`, and a duplicate: dropped
    assert len(pool._free[(10, torch.float32, torch.device("cpu"))]) == 2


def test_pack_into_pooled_buffers_equals_the_concatenation():
    ts = [torch.arange(6.0).view(2, 3), torch.ones(4), torch.arange(3, dtype=torch.bfloat16)]
    buckets = flatten_buckets(ts, bucket_bytes=1 << 20)
    pool = BufferPool()
    stale = pool.take(10, torch.float32, torch.device("cpu")).fill_(7.0)
    pool.give([stale])
    flats = pack(ts, buckets, torch.device("cpu"), pool)
    assert flats[0] is stale and torch.equal(flats[0], torch.cat([ts[0].reshape(-1), ts[1]]))
    assert torch.equal(flats[1], ts[2]) and flats[1].dtype == torch.bfloat16
    ts[1].add_(1)  # a copy: the caller may change its tensors while the send is in flight
    assert float(flats[0][6]) == 1.0


def test_bucket_by_bucket_checks_equal_the_whole_body_checksum():
    from decentrain.core.comm.wire import BodyCheck, body_problem, checksum

    bufs = [torch.randn(1001), torch.randn(77), torch.arange(5, dtype=torch.int64) * (2**61)]  # partial sums wrap
    check = BodyCheck()
    for b in bufs:
        check.add(b)
    assert check.total == int(checksum(bufs))
    header = torch.zeros(8, dtype=torch.int64)
    header[6] = check.total
    assert body_problem(bufs, header) is None
    bufs[1][3] = float("nan")
    header[6] = int(checksum(bufs))
    assert body_problem(bufs, header)[0] == "nonfinite"
