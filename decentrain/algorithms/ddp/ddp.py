"""Data parallel: all-reduce gradients every step, via torch's DistributedDataParallel."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

from decentrain.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig
from decentrain.core.comm.transport import ring_all_reduce_bytes


@dataclass
class DDPConfig(AlgorithmConfig):
    name: str = "ddp"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    exact_resume: bool = True  # bit-identical losses after a restart: one extra backward per resume (see on_resume)

    def __post_init__(self) -> None:
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"algorithm.bucket_cap_mb={self.bucket_cap_mb} must be > 0")


@ALGORITHMS.register("ddp", config=DDPConfig)
class DDP(Algorithm):
    """The quality reference. Replicas stay identical: DDP broadcasts rank 0's weights on wrap."""

    cfg: DDPConfig
    syncs_every_step = True
    _sent = 0
    _per_step = 0  # every step all-reduces every gradient once (the trainer's no_sync spares the others)

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if not self.world.is_distributed:
            return model
        grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self._per_step = ring_all_reduce_bytes(grads, self.world.world_size)
        device_ids = [self.world.device.index] if self.world.device.type == "cuda" else None
        return DistributedDataParallel(
            model,
            device_ids=device_ids,
            process_group=self.world.group,
            bucket_cap_mb=self.cfg.bucket_cap_mb,
            gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
            # no per-step autograd-graph walk and used-parameter all-reduce: every parameter gets a gradient
            find_unused_parameters=False,
        )

    def on_resume(self, model: torch.nn.Module, backward_once) -> None:
        # Exact resume: DDP lays its buckets out again, in gradient-ready order, after its first synchronized
        # backward. With >2 ranks a ring all-reduce's summation order per element depends on the element's
        # offset in the flat bucket, so a restarted process that reduced its first step with the initial
        # layout would drift from the uninterrupted run (~5e-7). The uninterrupted run rebuilt after step 1;
        # a resumed one replays that backward (its gradients dropped) before its first step, so both reduce
        # every later step with the same layout. Costs one forward/backward per resume, nothing per step.
        if self.cfg.exact_resume and isinstance(model, DistributedDataParallel):
            backward_once()

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        self._sent += self._per_step
        return {}

    def bytes_sent(self) -> int | None:
        return self._sent

    def no_sync(self, model: torch.nn.Module):
        return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()
