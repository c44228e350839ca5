"""Top-k + low-bit compression of a pseudo-gradient, with error feedback.

A reusable piece of the outer sync: it turns one replica's flat fp32 pseudo-gradient
into a small sparse message and remembers, in fp32, everything it did not send.
Notation as in outer/updates.py (θ fast weights, Δ = θ_prev − θ the pseudo-gradient).

Error feedback (DeMo, arXiv 2411.19870; SparseLoCo, arXiv 2508.15706, Alg. 1), per
replica r at outer round t, with R replicas:

    e_r ← β·e_r + Δ_r                   accumulate: what was not sent is sent later
    c_r  = Q_b(TopK_k(e_r))             the k largest |e| of each tile, b-bit values
    e_r ← e_r − D(c_r)                  keep exactly the compression error (D: decode)
    Δ̄_j = Σ_r D(c_r)_j / |S_j|         S_j = the replicas whose c_r carries index j (Δ̄_j = 0 if none):
                                         the mean over the senders of each index, as the reference code
                                         aggregates (templar's TopKCompressor.decompress/batch_decompress,
                                         `scatter_reduce_(..., reduce="mean", include_self=False)`)
    θ_t  = θ_{t−1} − α·Δ̄               SparseLoCo's outer step: plain SGD, the decayed
                                         EF accumulator stands in for outer momentum

Aggregation, picked by name (`AGGREGATIONS`): "mean_over_senders" (above, the default) or
"sum_over_replicas", Δ̄ = (1/R)·Σ_r D(c_r), the paper's text. With little overlap between the
replicas' indices the latter moves each entry by about 1/R of what its sender sent, while the
sender's e has already dropped all of it: the effective outer step shrinks like α/R.

Tiles (`CompressionSpec`), two layouts:
  - `tiled` (the reference's, templar `ChunkingTransformer` with target_chunk 64): each tensor
    on its own, a matrix cut into h×w tiles with h, w the largest divisors of its two sides
    that are ≤ 64 (a 1-D tensor into pieces of the largest divisor ≤ 64); k scaled to the
    tile, k_t = max(1, round(k·h·w / 64²)), so every tile has the same density;
  - `flat` (this library's first layout, kept as an option): chunks of C entries over the flat
    concatenation of all parameters (a chunk may span two tensors), the last one zero-padded.
Each tensor (tiled) or the whole vector (flat) is one `TileGroup`: its tiles share a length, a k
and one quantiser scope. Q_b and D are in outer/sparse_quantizers.py ("statistical", the
reference's 2-bit quantiser, or "maxabs").

The error buffer e is the algorithm's state: it goes into the checkpoint and a resumed
run continues with the same e, bit for bit (dropping it changes the next payload).

NoLoCo with compression is built in algorithms/noloco/compressed_gossip.py (equations
there): the partner's pseudo-gradient travels through this module's error feedback, its
slow weights as a fresh compressed drift from an anchor every replica shares.

Departures from the reference, named: k is scaled to a tile smaller than 64×64 (templar keeps
min(k, tile length) per tile, so its small tiles and 1-D tensors, which it cuts into ≤ 64
pieces, are denser); no DCT (DeMo's transform; SparseLoCo's reference runs with use_dct off
too); indices travel as uint16 sorted within their tile (templar packs them in 12 bits, in
top-k order): 16 + b bits per kept value instead of 12 + b.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from decentrain.algorithms.outer.sparse_quantizers import QUANTIZERS
from decentrain.core.registry import Registry

BITS = (2, 4, 8)
MAX_CHUNK = 1 << 16  # indices travel as uint16
TILE = 64  # the reference's target_chunk: a tile side


@dataclass(frozen=True)
class TileGroup:
    """`n` tiles of `length` entries with `k` kept per tile, one quantiser scope.

    `positions` [n, length] are the flat indices of each tile's entries; numel (one past the
    end) marks the zero padding of the last flat chunk."""

    n: int
    length: int
    k: int
    positions: Tensor = field(compare=False, repr=False)


def largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def tensor_tiles(shape: Sequence[int], offset: int, tile: int, k: int) -> TileGroup:
    """One tensor's h×w tiles (1-D: pieces of w), k scaled to the tile: max(1, round(k·h·w / tile²))."""
    shape = tuple(shape) or (1,)
    rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
    h = largest_divisor_at_most(rows, tile) if len(shape) > 1 else 1
    w = largest_divisor_at_most(cols, tile)
    pos = torch.arange(rows * cols).view(rows // h, h, cols // w, w).permute(0, 2, 1, 3).reshape(-1, h * w) + offset
    return TileGroup(pos.shape[0], h * w, min(h * w, max(1, round(k * h * w / tile**2))), pos)


def flat_chunks(numel: int, chunk: int, k: int) -> TileGroup:
    """Chunks of C over the flat vector, the last one padded with the pad slot (index numel)."""
    n = -(-numel // chunk)
    pos = torch.arange(n * chunk).clamp_(max=numel).view(n, chunk)
    return TileGroup(n, chunk, k, pos)


@dataclass(frozen=True)
class CompressionSpec:
    """What every replica agrees on: the flat length, the tile groups, b bits and the quantiser."""

    numel: int
    groups: tuple[TileGroup, ...]
    bits: int
    quantizer: str = "statistical"

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits={self.bits} must be one of {list(BITS)}")
        QUANTIZERS.get(self.quantizer, field="quantizer")
        if self.numel < 1:
            raise ValueError(f"numel={self.numel} must be >= 1")
        for g in self.groups:
            if not 1 <= g.length <= MAX_CHUNK:
                raise ValueError(f"chunk={g.length} must be in [1, {MAX_CHUNK}]")
            if not 1 <= g.k <= g.length:
                raise ValueError(f"k={g.k} must be in [1, chunk={g.length}]")

    @classmethod
    def flat(cls, numel: int, chunk: int, k: int, bits: int, quantizer: str = "maxabs") -> "CompressionSpec":
        if not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(f"chunk={chunk} must be in [1, {MAX_CHUNK}]")
        return cls(numel, (flat_chunks(numel, chunk, k),), bits, quantizer)

    @classmethod
    def tiled(
        cls, shapes: Sequence[Sequence[int]], k: int, bits: int, quantizer: str = "statistical", tile: int = TILE
    ) -> "CompressionSpec":
        groups, offset = [], 0
        for shape in shapes:
            groups.append(tensor_tiles(shape, offset, tile, k))
            offset += math.prod(shape)
        return cls(offset, tuple(groups), bits, quantizer)

    @property
    def kept(self) -> int:
        """Values (and indices) one message carries."""
        return sum(g.n * g.k for g in self.groups)

    @property
    def num_params(self) -> int:
        """fp32 quantiser parameters one message carries."""
        q = QUANTIZERS.get(self.quantizer)
        return sum(q.num_params(g.n, self.bits) for g in self.groups)

    @property
    def packed_codes_bytes(self) -> int:
        return -(-self.kept * self.bits // 8)

    @property
    def body_bytes(self) -> int:
        """uint16 indices + fp32 quantiser parameters + packed b-bit codes."""
        return self.kept * 2 + self.num_params * 4 + self.packed_codes_bytes

    def digest(self) -> int:
        """64 bits naming the layout (numel, tiles, k, bits, quantiser): a payload of another layout is dropped."""
        import hashlib

        layout = repr((self.numel, [(g.n, g.length, g.k) for g in self.groups], self.bits, self.quantizer))
        return int.from_bytes(hashlib.blake2b(layout.encode(), digest_size=8).digest(), "little")


@dataclass
class SparseChunks:
    """One compressed message, per tile group: k sorted indices and k b-bit codes per tile, the quantiser's
    parameters."""

    idx: list[Tensor]  # int64 [n, k] per group, strictly increasing along dim 1, each < length
    codes: list[Tensor]  # uint8 [n, k] per group, each < 2^bits
    params: list[Tensor]  # fp32 per group, finite (maxabs: the scales, >= 0)


def topk_per_chunk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest |x| of each row: (indices sorted ascending, their signed values)."""
    idx = x.abs().topk(k, dim=1, sorted=False).indices.sort(dim=1).values
    return idx, x.gather(1, idx)


def tiles_of(flat: Tensor, g: TileGroup) -> Tensor:
    """[n, length] view of the group's tiles (the pad slot reads as 0: it never outranks a real entry)."""
    padded = torch.cat([flat, flat.new_zeros(1)])
    return padded[g.positions.to(flat.device)]


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Flat uint8 codes (< 2^bits) -> 8/bits codes per byte, low bits first."""
    per = 8 // bits
    flat = codes.reshape(-1)
    pad = -flat.numel() % per
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    flat = flat.view(-1, per).to(torch.int32)
    shifts = torch.arange(per, dtype=torch.int32, device=flat.device) * bits
    return (flat << shifts).sum(dim=1).to(torch.uint8)


def unpack_codes(packed: Tensor, bits: int, count: int) -> Tensor:
    """Inverse of `pack_codes`: the first `count` codes."""
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32, device=packed.device) * bits
    codes = (packed.to(torch.int32)[:, None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:count].to(torch.uint8)


def compress(flat: Tensor, spec: CompressionSpec) -> SparseChunks:
    """c = Q_b(TopK_k(x)) of a flat fp32 tensor, tile group by tile group."""
    q = QUANTIZERS.get(spec.quantizer)
    c = SparseChunks([], [], [])
    for g in spec.groups:
        idx, vals = topk_per_chunk(tiles_of(flat.float(), g), g.k)
        codes, params = q.quantize(vals, spec.bits)
        c.idx.append(idx)
        c.codes.append(codes)
        c.params.append(params)
    return c


def _scatter(c: SparseChunks, spec: CompressionSpec, values: list[Tensor]) -> Tensor:
    """A dense flat fp32 tensor with values[g] at group g's kept positions, zero elsewhere."""
    device = values[0].device if values else torch.device("cpu")
    out = torch.zeros(spec.numel + 1, dtype=torch.float32, device=device)  # + the pad slot
    for g, idx, v in zip(spec.groups, c.idx, values):
        out[g.positions.to(device).gather(1, idx.to(device))] = v.float()
    return out[: spec.numel]


def decompress(c: SparseChunks, spec: CompressionSpec) -> Tensor:
    """D(c): a dense flat fp32 tensor of `spec.numel` entries, zero where nothing was sent."""
    q = QUANTIZERS.get(spec.quantizer)
    return _scatter(c, spec, [q.dequantize(codes, params, spec.bits) for codes, params in zip(c.codes, c.params)])


def sent_mask(c: SparseChunks, spec: CompressionSpec) -> Tensor:
    """1 where c carries an index (whatever value it decodes to), 0 elsewhere: dense flat fp32."""
    return _scatter(c, spec, [torch.ones(i.shape, device=p.device) for i, p in zip(c.idx, c.params)])


Aggregation = Callable[[Sequence[Tensor], Sequence[Tensor]], Tensor]
AGGREGATIONS: Registry[Aggregation] = Registry("algorithm.aggregation")


@AGGREGATIONS.register("mean_over_senders")
def mean_over_senders(values: Sequence[Tensor], masks: Sequence[Tensor]) -> Tensor:
    """Δ̄_j = Σ_r D(c_r)_j / |S_j| (0 where nobody sent j), from each payload's D(c) and `sent_mask`."""
    count = torch.stack(list(masks)).sum(0)
    return torch.stack(list(values)).sum(0) / count.clamp_min(1.0)


@AGGREGATIONS.register("sum_over_replicas")
def sum_over_replicas(values: Sequence[Tensor], masks: Sequence[Tensor]) -> Tensor:
    """Δ̄ = (1/R)·Σ_r D(c_r) over the R payloads given (the paper's text)."""
    return torch.stack(list(values)).sum(0) / len(values)


class ErrorFeedback:
    """The fp32 error buffer e of one replica and the three EF equations around a compressor."""

    def __init__(self, spec: CompressionSpec, beta: float, device: torch.device | str = "cpu"):
        self.spec, self.beta = spec, beta
        self.error = torch.zeros(spec.numel, dtype=torch.float32, device=device)

    @torch.no_grad()
    def step(self, delta: Tensor) -> SparseChunks:
        """e ← β·e + Δ;  c = C(e);  e ← e − D(c).  Returns c (what goes on the wire)."""
        self.error.mul_(self.beta).add_(delta.detach().reshape(-1).to(self.error))
        c = compress(self.error, self.spec)
        self.error.sub_(decompress(c, self.spec))
        return c

    def state_dict(self) -> dict[str, Any]:
        return {"error": self.error.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        error = state["error"]
        if tuple(error.shape) != (self.spec.numel,):
            raise ValueError(
                f"error-feedback buffer has shape {tuple(error.shape)}, the model needs ({self.spec.numel},)"
            )
        self.error.copy_(error.float())
