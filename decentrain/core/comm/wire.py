"""The wire format of point-to-point messages between replicas: buckets, header, checksum, tags.

A partner is untrusted: a fixed-size header (magic, round, layout digest, checksum) travels
before every body, so a receiver posts a body receive only for exactly the sizes it expects
(gloo aborts the whole process, uncatchably, when a message is larger than its receive
buffer) and can check what arrived. Every p2p message of the library takes its tag from
`Tags` here: gossip rounds below `HEAL_BASE`, a heal's parts above it, so the two can never
match each other's receives on a shared pair group.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import torch

MAGIC = 0x6463_7472_6E67  # "dctrng"
VERSION = 2  # 2: checksum over 8-byte words
HEADER_LEN = 8  # [magic, version, round, n_buckets, layout digest, total numel, checksum, flags]
FLAG_SKIP = 1  # the sender skips this round: no body follows
_MASK = (1 << 62) - 1


class Tags:
    """The one allocator of p2p tags: `round_idx`'s header and buckets, and a heal's parts.

    A round owns SLOTS consecutive tags (the last one for its header), so a late message
    never matches a later round's receive; rounds wrap after 2**20, far beyond any backlog.
    """

    SLOTS = 1024
    ROUNDS = 1 << 20
    HEAL_BASE = 1 << 30  # above every round's tags (ROUNDS * SLOTS)

    @classmethod
    def header(cls, round_idx: int) -> int:
        return (round_idx % cls.ROUNDS) * cls.SLOTS + cls.SLOTS - 1

    @classmethod
    def buckets(cls, round_idx: int, n: int) -> list[int]:
        base = (round_idx % cls.ROUNDS) * cls.SLOTS
        return [base + b % (cls.SLOTS - 1) for b in range(n)]

    @classmethod
    def heal(cls, part: int) -> int:
        """Part 0 is the heal header, 1.. the payloads."""
        return cls.HEAL_BASE + part


def flatten_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Split tensor indices into consecutive buckets of at most `bucket_bytes` (one tensor may exceed it).

    A bucket holds one dtype: concatenating bf16 weights with an fp32 tensor would
    promote, and so double, the whole bucket on the wire.
    """
    buckets: list[list[int]] = [[]]
    size = 0
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        if buckets[-1] and (size + nbytes > bucket_bytes or tensors[buckets[-1][0]].dtype != t.dtype):
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return [b for b in buckets if b]


def pack(
    tensors: Sequence[torch.Tensor], buckets: list[list[int]], device: torch.device, pool=None
) -> list[torch.Tensor]:
    """One flat copy per bucket on `device` (always a copy: a send may outlive the caller's tensors).

    With `pool` (core/comm/buffer_pool.BufferPool) the copies land in reused buffers: a fresh
    model-sized buffer costs more to fault in than the copy itself.
    """
    out = []
    for idx in buckets:
        numel, dtype = sum(tensors[i].numel() for i in idx), tensors[idx[0]].dtype
        flat = pool.take(numel, dtype, device) if pool is not None else torch.empty(numel, dtype=dtype, device=device)
        offset = 0
        for i in idx:
            n = tensors[i].numel()
            flat[offset : offset + n].copy_(tensors[i].reshape(-1))
            offset += n
        out.append(flat)
    return out


def unpack(flats: Sequence[torch.Tensor], buckets: list[list[int]], like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors of `like`'s shapes, dtypes and device, read back out of received buckets."""
    out: list[torch.Tensor | None] = [None] * len(like)
    for idx, flat in zip(buckets, flats, strict=True):
        offset = 0
        for i in idx:
            n = like[i].numel()
            out[i] = flat[offset : offset + n].view_as(like[i]).to(like[i].device)
            offset += n
    return out  # type: ignore[return-value]


def layout_digest(flats: Sequence[torch.Tensor]) -> int:
    """CRC32 of the (numel, dtype) of every bucket: equal digests mean equal receive sizes."""
    return zlib.crc32(";".join(f"{f.numel()}:{f.dtype}" for f in flats).encode())


def checksum(flats: Sequence[torch.Tensor]) -> torch.Tensor:
    """Wrapping int64 sum of every bucket's bytes read as 8-byte words (a shorter tail as bytes), mod 2**62.

    Computed where the buffers live, with no host sync: the sender's header stays on the
    backend's device (NCCL). Native-width words keep it one cheap pass (a sum of int32
    words widened to int64 cost 20x more on CPU: 0.55 s vs 0.02 s for 25M floats).
    """
    total = torch.zeros((), dtype=torch.int64, device=flats[0].device if flats else "cpu")
    for f in flats:
        if f.storage_offset() * f.element_size() % 8:
            f = f.clone()  # words are read in place, so they must start 8-byte aligned
        raw = f.reshape(-1).view(torch.uint8)
        whole = raw.numel() // 8 * 8
        total = total + raw[:whole].view(torch.int64).sum() + raw[whole:].sum(dtype=torch.int64)  # int64 adds wrap
    return (total & _MASK).reshape(1)


def all_finite(t: torch.Tensor) -> bool:
    """True when `t` holds no NaN or inf.

    One reduction decides the common case: a sum is finite only if every element is; only a
    sum that overflowed (or a tensor that really holds NaN/inf) pays for the elementwise pass.
    """
    if not t.is_floating_point():
        return True
    return bool(torch.isfinite(t.sum(dtype=torch.float32))) or bool(torch.isfinite(t).all())


def make_header(round_idx: int, flats: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    fixed = torch.tensor(
        [MAGIC, VERSION, round_idx, len(flats), layout_digest(flats), sum(f.numel() for f in flats)],
        dtype=torch.int64,
        device=device,
    )
    return torch.cat([fixed, checksum(flats).to(device), torch.zeros(1, dtype=torch.int64, device=device)])


def skip_header(round_idx: int, device: torch.device) -> torch.Tensor:
    """The header a rank sends alone when it skips `round_idx` (no body follows)."""
    return torch.tensor([MAGIC, VERSION, round_idx, 0, 0, 0, 0, FLAG_SKIP], dtype=torch.int64, device=device)


def header_problem(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Why a received header is not the one this round expects (None if it is)."""
    g, e = got.tolist(), expected.tolist()
    for i, name in enumerate(("magic", "version", "round", "bucket count", "layout (sizes/dtypes)", "numel")):
        if g[i] != e[i]:
            return f"{name} {g[i]} != expected {e[i]}"
    return None


class BodyCheck:
    """`body_problem` one bucket at a time, as each arrives: the checks of a bucket overlap the
    transfer of the next ones. Partial checksums add up mod 2**62 (the word sum wraps at 2**64,
    a multiple of 2**62), so the result equals the checksum of the whole body."""

    def __init__(self) -> None:
        self.total, self.finite = 0, True

    def add(self, buf: torch.Tensor) -> None:
        self.total = (self.total + int(checksum([buf]))) & _MASK
        self.finite = self.finite and all_finite(buf)

    def problem(self, header: torch.Tensor) -> tuple[str, str] | None:
        if self.total != int(header[6]):
            return "corrupt", "body checksum differs from the header's"
        if not self.finite:
            return "nonfinite", "NaN or inf in the partner's tensors"
        return None


def body_problem(bufs: Sequence[torch.Tensor], header: torch.Tensor) -> tuple[str, str] | None:
    """(status, why) when a received body does not match its header's checksum or holds NaN/inf."""
    check = BodyCheck()
    for b in bufs:
        check.add(b)
    return check.problem(header)
