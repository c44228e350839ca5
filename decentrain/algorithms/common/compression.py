"""Top-k + low-bit compression of a pseudo-gradient, with error feedback.

A reusable piece of the outer sync: it turns one replica's flat fp32 pseudo-gradient
into a small sparse message and remembers, in fp32, everything it did not send.
Notation as in common/outer.py (θ fast weights, Δ = θ_prev − θ the pseudo-gradient).

Error feedback (DeMo, arXiv 2411.19870; SparseLoCo, arXiv 2508.15706, Alg. 1), per
replica r at outer round t, with R replicas:

    e_r ← β·e_r + Δ_r                   accumulate: what was not sent is sent later
    c_r  = Q_b(TopK_k(e_r))             the k largest |e| of each chunk of C entries, b-bit values
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

Q_b, the per-chunk symmetric quantiser of the kept values v (one fp32 scale s per chunk,
L = 2^b levels evenly spaced over [−s, s], both ends included):

    s     = max_j |v_j|
    code  = round((v + s)·(L − 1) / (2s))   ∈ {0, …, L−1}
    D(code) = −s + code·2s/(L − 1)
    b = 2: D ∈ {−s, −s/3, s/3, s};  s = 0 (an all-zero chunk) decodes to zeros.

The error buffer e is the algorithm's state: it goes into the checkpoint and a resumed
run continues with the same e, bit for bit (dropping it changes the next payload).

NoLoCo with compression is built in algorithms/noloco/compressed_gossip.py (equations
there): the partner's pseudo-gradient travels through this module's error feedback, its
slow weights as a fresh compressed drift from an anchor every replica shares.

Departures from the papers, named: chunks run over the flat concatenation of all
parameters (a chunk may span two tensors; SparseLoCo chunks each tensor, 64×64 blocks
for matrices), and no DCT (DeMo's transform; SparseLoCo drops it too). Indices travel as
uint16 (so C ≤ 65536), sorted within their chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from decentrain.core.registry import Registry

BITS = (2, 4, 8)
MAX_CHUNK = 1 << 16  # indices travel as uint16


@dataclass(frozen=True)
class CompressionSpec:
    """What every replica agrees on: the flat length, chunk size C, k kept per chunk, b bits."""

    numel: int
    chunk: int
    k: int
    bits: int

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"bits={self.bits} must be one of {list(BITS)}")
        if not 1 <= self.chunk <= MAX_CHUNK:
            raise ValueError(f"chunk={self.chunk} must be in [1, {MAX_CHUNK}]")
        if not 1 <= self.k <= self.chunk:
            raise ValueError(f"k={self.k} must be in [1, chunk={self.chunk}]")
        if self.numel < 1:
            raise ValueError(f"numel={self.numel} must be >= 1")

    @property
    def num_chunks(self) -> int:
        return -(-self.numel // self.chunk)

    @property
    def packed_codes_bytes(self) -> int:
        return -(-self.num_chunks * self.k * self.bits // 8)

    @property
    def body_bytes(self) -> int:
        """uint16 indices + fp32 scales + packed b-bit codes."""
        return self.num_chunks * self.k * 2 + self.num_chunks * 4 + self.packed_codes_bytes


@dataclass
class SparseChunks:
    """One compressed message: per chunk, k sorted indices, k b-bit codes and one scale."""

    idx: Tensor  # int64 [chunks, k], strictly increasing along dim 1, each < chunk
    codes: Tensor  # uint8 [chunks, k], each < 2^bits
    scale: Tensor  # fp32 [chunks], finite, >= 0


def chunked(flat: Tensor, chunk: int) -> Tensor:
    """[numel] -> [ceil(numel/chunk), chunk], zero-padded (zeros never outrank a real entry)."""
    pad = -flat.numel() % chunk
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, chunk)


def topk_per_chunk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest |x| of each row: (indices sorted ascending, their signed values)."""
    idx = x.abs().topk(k, dim=1, sorted=False).indices.sort(dim=1).values
    return idx, x.gather(1, idx)


def quantize_symmetric(vals: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """Q_b per row: (uint8 codes, fp32 scale s = max |v|); see the module docstring."""
    levels = (1 << bits) - 1
    scale = vals.abs().amax(dim=1)
    step = (2 * scale / levels).clamp_min(torch.finfo(torch.float32).tiny)
    codes = ((vals + scale[:, None]) / step[:, None]).round_().clamp_(0, levels)
    return codes.to(torch.uint8), scale


def dequantize_symmetric(codes: Tensor, scale: Tensor, bits: int) -> Tensor:
    """D(code) = −s + code·2s/(L−1), in fp32."""
    levels = (1 << bits) - 1
    return -scale[:, None] + codes.float() * (2 * scale / levels)[:, None]


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
    """c = Q_b(TopK_k(x)) of a flat fp32 tensor."""
    idx, vals = topk_per_chunk(chunked(flat.float(), spec.chunk), spec.k)
    codes, scale = quantize_symmetric(vals, spec.bits)
    return SparseChunks(idx, codes, scale)


def decompress(c: SparseChunks, spec: CompressionSpec) -> Tensor:
    """D(c): a dense flat fp32 tensor of `spec.numel` entries, zero where nothing was sent."""
    out = torch.zeros(spec.num_chunks, spec.chunk, dtype=torch.float32, device=c.scale.device)
    out.scatter_(1, c.idx, dequantize_symmetric(c.codes, c.scale, spec.bits))
    return out.view(-1)[: spec.numel]


def sent_mask(c: SparseChunks, spec: CompressionSpec) -> Tensor:
    """1 where c carries an index (whatever value it decodes to), 0 elsewhere: dense flat fp32."""
    out = torch.zeros(spec.num_chunks, spec.chunk, dtype=torch.float32, device=c.scale.device)
    out.scatter_(1, c.idx, 1.0)
    return out.view(-1)[: spec.numel]


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
            raise ValueError(f"error-feedback buffer has shape {tuple(error.shape)}, the model needs ({self.spec.numel},)")
        self.error.copy_(error.float())
