"""The collectives of DiLoCo and Streaming DiLoCo: mean of pseudo-gradients across replicas.

Full precision goes through one flat all-reduce (the ring, on gloo and nccl). A
quantised payload cannot be summed on the wire (int4 codes are not additive and fp16
sums lose precision), so it is all-gathered and each replica dequantises and
averages in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from decentrain.algorithms.common.outer import QuantKind, dequantize, quantize
from decentrain.core.world import World

QUANTIZATIONS = ("none", "fp16", "int4")
# Backends with all_gather of uint8/fp16 buffers; others (mpi, ucc builds) are not tested here.
QUANT_BACKENDS = ("gloo", "nccl")


def check_quantization_backend(quantization: str, backend: str | None) -> None:
    if quantization != "none" and backend is not None and backend not in QUANT_BACKENDS:
        raise ValueError(
            f"algorithm.quantization={quantization!r} needs all_gather of packed buffers, which backend "
            f"{backend!r} is not supported for; allowed backends: {list(QUANT_BACKENDS)} (or quantization: none)"
        )


@dataclass
class PendingMean:
    """An in-flight mean; `result()` waits and returns fp32 tensors shaped like the inputs."""

    works: list
    parts: list[list[torch.Tensor]]  # per wire part, one buffer per rank (all-reduce: one summed buffer)
    like: list[torch.Tensor]
    kind: QuantKind
    n: int
    chunk: int

    def result(self) -> list[torch.Tensor]:
        for w in self.works:
            w.wait()
        self.works = []
        numel = sum(t.numel() for t in self.like)
        if self.kind == "none":
            flat = self.parts[0][0] / self.n
        else:
            flat = torch.zeros(numel, dtype=torch.float32, device=self.like[0].device)
            for peer in range(self.n):
                flat += dequantize([part[peer] for part in self.parts], self.kind, (numel,), self.chunk)
            flat /= self.n
        return list(_unflatten_dense_tensors(flat, self.like))


def start_mean(world: World, tensors: list[torch.Tensor], kind: QuantKind = "none", chunk: int = 128) -> PendingMean:
    """Start averaging `tensors` over the world's ranks (async); fp32 accumulation in every mode."""
    n = world.world_size if world.is_distributed else 1
    flat = _flatten_dense_tensors([t.detach().float() for t in tensors])
    like = [torch.empty(t.shape, dtype=torch.float32, device=flat.device) for t in tensors]
    if kind == "none":
        works = [dist.all_reduce(flat, group=world.group, async_op=True)] if n > 1 else []
        return PendingMean(works, [[flat]], like, kind, n, chunk)
    parts, works = [], []
    for part in quantize(flat, kind, chunk):  # one flat payload: chunks may span tensor boundaries
        gathered = [torch.empty_like(part) for _ in range(n)]
        if n > 1:
            works.append(dist.all_gather(gathered, part, group=world.group, async_op=True))
        else:
            gathered[0].copy_(part)
        parts.append(gathered)
    return PendingMean(works, parts, like, kind, n, chunk)
