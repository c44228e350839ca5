"""Q_b and D, the b-bit quantisers of the values top-k keeps, picked by name (`QUANTIZERS`).

Each works on one quantiser scope: `vals` [tiles, k] (one tensor's tiles, or one flat chunk per
row) and returns uint8 codes [tiles, k] plus a flat fp32 parameter vector that travels with them.

"statistical" (the reference's, templar `TopKCompressor._quantize_values` with
`quantization_bins` L = 2^b, `quantization_range` 6): one scope per tensor,

    μ = mean(v) ;  c = v − μ ;  σ = ‖c‖ / √(n − 1) ;  s = 6σ / L   (s = 1 if it is 0 or not finite)
    code = clamp(round(c/s + L/2), 0, L − 1)
    lookup[q] = mean of the c whose code is q (0 for an empty bin)
    D(code) = lookup[code] + μ                      parameters: [μ, lookup_0 … lookup_{L−1}]

  so each code decodes to the mean of the values in its bin: a lone spike gets a bin of its
  own and comes back exactly; the top-k values of a Gaussian (two clusters, ±) come back
  with about 1 % relative squared error.

"maxabs" (this library's first quantiser, kept as an option): one scale per row,

    s = max_j |v_j| ;  code = round((v + s)·(L − 1) / (2s)) ;  D(code) = −s + code·2s/(L − 1)
    b = 2: D ∈ {−s, −s/3, s/3, s}; s = 0 decodes to zeros.   parameters: [s per row]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from decentrain.core.registry import Registry

RANGE_SIGMAS = 6.0  # templar hparams quantization_range


class Quantizer:
    """One registry entry: how many parameters a scope carries, Q_b and D."""

    @staticmethod
    def num_params(tiles: int, bits: int) -> int:
        raise NotImplementedError

    @staticmethod
    def quantize(vals: Tensor, bits: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    @staticmethod
    def dequantize(codes: Tensor, params: Tensor, bits: int) -> Tensor:
        raise NotImplementedError

    @staticmethod
    def params_ok(params: Tensor) -> bool:
        """Peer data check: what a decoder accepts (always finite)."""
        return bool(torch.isfinite(params).all())


QUANTIZERS: Registry[type[Quantizer]] = Registry("algorithm.quantizer")


def statistical_scale(centered: Tensor, bins: int) -> Tensor:
    """s = 6σ / L with σ = ‖c‖/√(n−1); 1 when that is 0 or not finite (templar's fallback)."""
    n = centered.numel()
    std = centered.norm() / math.sqrt(n - 1) if n > 1 else centered.new_tensor(float("nan"))
    scale = RANGE_SIGMAS * std / bins
    return scale if bool(torch.isfinite(scale)) and float(scale) > 0 else centered.new_tensor(1.0)


def bin_means(centered: Tensor, codes: Tensor, bins: int) -> Tensor:
    """lookup[q] = mean of the centred values whose code is q (0 where none is)."""
    flat = codes.reshape(-1).long()
    sums = torch.zeros(bins, dtype=torch.float32, device=centered.device).scatter_add_(0, flat, centered.reshape(-1))
    counts = torch.zeros(bins, dtype=torch.float32, device=centered.device).scatter_add_(
        0, flat, torch.ones_like(centered.reshape(-1))
    )
    return torch.where(counts > 0, sums / counts.clamp_min(1.0), torch.zeros_like(sums))


@QUANTIZERS.register("statistical")
class Statistical(Quantizer):
    @staticmethod
    def num_params(tiles: int, bits: int) -> int:
        return 1 + (1 << bits)

    @staticmethod
    def quantize(vals: Tensor, bits: int) -> tuple[Tensor, Tensor]:
        bins = 1 << bits
        vals = vals.float()
        shift = vals.mean()
        centered = vals - shift
        scale = statistical_scale(centered, bins)
        codes = (centered / scale + bins // 2).round_().clamp_(0, bins - 1).to(torch.uint8)
        return codes, torch.cat([shift.reshape(1), bin_means(centered, codes, bins)])

    @staticmethod
    def dequantize(codes: Tensor, params: Tensor, bits: int) -> Tensor:
        return params[1:][codes.long()] + params[0]


@QUANTIZERS.register("maxabs")
class MaxAbs(Quantizer):
    @staticmethod
    def num_params(tiles: int, bits: int) -> int:
        return tiles

    @staticmethod
    def quantize(vals: Tensor, bits: int) -> tuple[Tensor, Tensor]:
        levels = (1 << bits) - 1
        scale = vals.abs().amax(dim=1).float()
        step = (2 * scale / levels).clamp_min(torch.finfo(torch.float32).tiny)
        codes = ((vals + scale[:, None]) / step[:, None]).round_().clamp_(0, levels)
        return codes.to(torch.uint8), scale

    @staticmethod
    def dequantize(codes: Tensor, params: Tensor, bits: int) -> Tensor:
        levels = (1 << bits) - 1
        return -params[:, None] + codes.float() * (2 * params / levels)[:, None]

    @staticmethod
    def params_ok(params: Tensor) -> bool:
        return bool(torch.isfinite(params).all() and (params >= 0).all())
