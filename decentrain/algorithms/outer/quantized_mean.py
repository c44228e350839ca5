"""Quantised payloads for a transport's collective mean (Streaming DiLoCo's fp16/int4 syncs).

Full precision goes through one flat all-reduce (`Transport.start_mean` without a codec). A
quantised payload cannot be summed on the wire (int4 codes are not additive and fp16 sums
lose precision), so it is all-gathered and each replica dequantises and averages in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from decentrain.algorithms.outer.updates import QuantKind, dequantize, quantize

QUANTIZATIONS = ("none", "fp16", "int4")
# Backends with all_gather of uint8/fp16 buffers; others (mpi, ucc builds) are not tested here.
QUANT_BACKENDS = ("gloo", "nccl")


def check_quantization_backend(quantization: str, backend: str | None) -> None:
    if quantization != "none" and backend is not None and backend not in QUANT_BACKENDS:
        raise ValueError(
            f"algorithm.quantization={quantization!r} needs all_gather of packed buffers, which backend "
            f"{backend!r} is not supported for; allowed backends: {list(QUANT_BACKENDS)} (or quantization: none)"
        )


@dataclass(frozen=True)
class QuantCodec:
    """A `core.comm.transport.MeanCodec` for `quantize`/`dequantize` (chunks may span tensor boundaries)."""

    kind: QuantKind
    chunk: int = 128

    def encode(self, flat: torch.Tensor) -> Sequence[torch.Tensor]:
        return quantize(flat, self.kind, self.chunk)

    def decode(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        return dequantize(parts, self.kind, (numel,), self.chunk)


def codec_for(kind: QuantKind, chunk: int = 128) -> QuantCodec | None:
    """None for full precision (summed on the wire)."""
    return None if kind == "none" else QuantCodec(kind, chunk)
