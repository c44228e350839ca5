"""The wire format of one compressed pseudo-gradient (`compression.SparseChunks`), as bytes.

Layout, little-endian, fixed by the `CompressionSpec` every replica agrees on:

    header  32 B   magic "DSLC", version u8, bits u8, reserved u16, round u64,
                   numel u64, chunk u32, k u32
    idx     2·n·k  uint16, n = ceil(numel/chunk) chunks, k per chunk, ascending in each chunk
    scale   4·n    fp32, one per chunk
    codes   ⌈n·k·b/8⌉  b-bit codes, 8/b per byte, low bits first

So an honest payload has exactly `payload_bytes(spec)` bytes, known before anything
arrives: the receiver caps the all-gather at that size (no buffer is sized by a peer).
Peer bytes are data: `decode` never raises and never evaluates anything; it checks the
length and header against the spec before it allocates, then the values (indices in
range and strictly increasing per chunk, scales finite and >= 0), and otherwise
returns the reason the payload was dropped.
"""

from __future__ import annotations

import struct

import numpy as np
import torch

from decentrain.algorithms.common.compression import CompressionSpec, SparseChunks, pack_codes, unpack_codes

MAGIC = b"DSLC"
VERSION = 1
_HEADER = struct.Struct("<4sBBHQQII")


def payload_bytes(spec: CompressionSpec) -> int:
    return _HEADER.size + spec.body_bytes


def encode(c: SparseChunks, spec: CompressionSpec, round_: int) -> bytes:
    header = _HEADER.pack(MAGIC, VERSION, spec.bits, 0, round_, spec.numel, spec.chunk, spec.k)
    idx = c.idx.cpu().numpy().astype("<u2").tobytes()
    scale = c.scale.detach().float().cpu().numpy().astype("<f4").tobytes()
    codes = pack_codes(c.codes.cpu(), spec.bits).numpy().tobytes()
    return header + idx + scale + codes


def decode(data: bytes, spec: CompressionSpec, round_: int) -> tuple[SparseChunks | None, str]:
    """(chunks, "") for a valid payload of this spec and round, else (None, why it was dropped)."""
    if len(data) != payload_bytes(spec):
        return None, f"size {len(data)} != {payload_bytes(spec)}"
    magic, version, bits, _, rnd, numel, chunk, k = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        return None, "bad magic or version"
    if (bits, numel, chunk, k) != (spec.bits, spec.numel, spec.chunk, spec.k):
        return None, f"layout (bits, numel, chunk, k)={(bits, numel, chunk, k)} != ours"
    if rnd != round_:
        return None, f"round {rnd} != {round_}"
    n, off = spec.num_chunks, _HEADER.size
    idx = np.frombuffer(data, dtype="<u2", count=n * k, offset=off).astype(np.int64).reshape(n, k)
    off += 2 * n * k
    scale = np.frombuffer(data, dtype="<f4", count=n, offset=off).astype(np.float32)
    off += 4 * n
    packed = np.frombuffer(data, dtype=np.uint8, count=spec.packed_codes_bytes, offset=off)
    if (idx >= chunk).any() or (k > 1 and (np.diff(idx, axis=1) <= 0).any()):
        return None, "indices out of range or not strictly increasing"
    if not (np.isfinite(scale).all() and (scale >= 0).all()):
        return None, "non-finite or negative scale"
    codes = unpack_codes(torch.from_numpy(packed.copy()), bits, n * k).view(n, k)
    return SparseChunks(torch.from_numpy(idx), codes, torch.from_numpy(scale.copy())), ""
