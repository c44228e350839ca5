"""The wire format of one compressed pseudo-gradient (`compression.SparseChunks`), as bytes.

Layout, little-endian, fixed by the `CompressionSpec` every replica agrees on:

    header  32 B   magic "DSLC", version u8, bits u8, quantiser id u8, reserved u8, round u64,
                   numel u64, layout digest u64 (`CompressionSpec.digest`: tiles, k, bits, quantiser)
    idx     2·K    uint16, K = Σ_groups n·k: per tile, k indices ascending, tile groups in order
    params  4·P    fp32, each group's quantiser parameters in order (maxabs: a scale per tile;
                   statistical: the mean and 2^b bin means per group)
    codes   ⌈K·b/8⌉  b-bit codes, 8/b per byte, low bits first

So an honest payload has exactly `payload_bytes(spec)` bytes, known before anything
arrives: the receiver caps the all-gather at that size (no buffer is sized by a peer).
Peer bytes are data: `decode` never raises and never evaluates anything; it checks the
length and header against the spec before it allocates, then the values (indices in
range and strictly increasing per tile, parameters finite, maxabs scales >= 0), and
otherwise returns the reason the payload was dropped.
"""

from __future__ import annotations

import struct

import numpy as np
import torch

from decentrain.algorithms.outer.compression import CompressionSpec, SparseChunks, pack_codes, unpack_codes
from decentrain.algorithms.outer.sparse_quantizers import QUANTIZERS

MAGIC = b"DSLC"
VERSION = 2
_HEADER = struct.Struct("<4sBBBBQQQ")
QUANTIZER_IDS = {"maxabs": 0, "statistical": 1}


def payload_bytes(spec: CompressionSpec) -> int:
    return _HEADER.size + spec.body_bytes


def encode(c: SparseChunks, spec: CompressionSpec, round_: int) -> bytes:
    header = _HEADER.pack(
        MAGIC, VERSION, spec.bits, QUANTIZER_IDS[spec.quantizer], 0, round_, spec.numel, spec.digest()
    )
    idx = torch.cat([i.reshape(-1) for i in c.idx]).cpu().numpy().astype("<u2").tobytes()
    params = torch.cat([p.reshape(-1) for p in c.params]).detach().float().cpu().numpy().astype("<f4").tobytes()
    codes = pack_codes(torch.cat([x.reshape(-1) for x in c.codes]).cpu(), spec.bits).numpy().tobytes()
    return header + idx + params + codes


def decode(data: bytes, spec: CompressionSpec, round_: int) -> tuple[SparseChunks | None, str]:
    """(chunks, "") for a valid payload of this spec and round, else (None, why it was dropped)."""
    if len(data) != payload_bytes(spec):
        return None, f"size {len(data)} != {payload_bytes(spec)}"
    magic, version, bits, quantizer, _, rnd, numel, digest = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        return None, "bad magic or version"
    if (bits, quantizer, numel, digest) != (spec.bits, QUANTIZER_IDS[spec.quantizer], spec.numel, spec.digest()):
        return None, "layout (bits, quantiser, numel, tiles) is not ours"
    if rnd != round_:
        return None, f"round {rnd} != {round_}"
    q, off = QUANTIZERS.get(spec.quantizer), _HEADER.size
    idx = np.frombuffer(data, dtype="<u2", count=spec.kept, offset=off).astype(np.int64)
    off += 2 * spec.kept
    params = np.frombuffer(data, dtype="<f4", count=spec.num_params, offset=off).astype(np.float32)
    off += 4 * spec.num_params
    packed = np.frombuffer(data, dtype=np.uint8, count=spec.packed_codes_bytes, offset=off)
    codes = unpack_codes(torch.from_numpy(packed.copy()), bits, spec.kept)
    out = SparseChunks([], [], [])
    i = p = 0
    for g in spec.groups:
        gi = idx[i : i + g.n * g.k].reshape(g.n, g.k)
        gp = torch.from_numpy(params[p : p + q.num_params(g.n, bits)].copy())
        if (gi >= g.length).any() or (g.k > 1 and (np.diff(gi, axis=1) <= 0).any()):
            return None, "indices out of range or not strictly increasing"
        if not q.params_ok(gp):
            return None, "non-finite or negative quantiser parameters"
        out.idx.append(torch.from_numpy(gi))
        out.codes.append(codes[i : i + g.n * g.k].view(g.n, g.k))
        out.params.append(gp)
        i += g.n * g.k
        p += gp.numel()
    return out, ""
