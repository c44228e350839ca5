"""DDP across replica groups that may die and come back: torchft's Manager, DDP as torchft builds it.

Each step starts with a (synchronous) quorum of the live replica groups, taken after the
previous optimizer step and before the next batch is drawn. A group that is behind heals
there: it loads a live peer's whole trainer state (weights, AdamW, schedule, sampler
position, step) and runs this step with the others. Gradients are averaged by torchft's
DDP comm hook over the participating groups (inside a group of several ranks, over the
group first). The optimizer steps only if `should_commit()` agrees across groups: a step
whose collective failed (a group died mid-step) is dropped by everyone, not rolled back.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist

from decentrain.algorithms.base import Algorithm
from decentrain.algorithms.ddp.ddp import DDPConfig
from decentrain.algorithms.pretraining.torchft.manager import FT_ALGORITHMS, ReplicaGroup, build_manager, ft_metrics
from decentrain.core.world import World

log = logging.getLogger(__name__)


def group_then_replicas_hook(intra_group: dist.ProcessGroup | None, size: int):
    """DDP comm hook: mean over this group's ranks (torch.distributed), then over the replica groups (torchft).

    As torchft.ddp's hook, but a failed collective (a peer died mid-step: torchft then hands back a
    dummy work with no inner future, which torchft 0.2's hook asserts on) completes with the buffer
    as it is; the step is dropped by should_commit anyway.
    """

    def hook(manager, bucket):  # no annotations: DDP checks them, and this module has string annotations
        buf = bucket.buffer()
        if intra_group is not None:
            intra_group.allreduce([buf]).wait()  # the group object itself: registered with torch.distributed or not
            buf.div_(size)
        work = manager.allreduce(buf)  # mean over participants; a non-participant contributes zeros
        work.wait()
        inner = getattr(work.get_future(), "_fut", None)  # the torch future under torchft's managed one
        if inner is None:
            inner = torch.futures.Future()
            inner.set_result(buf)
        return inner

    return hook


@FT_ALGORITHMS.register("ddp")
class TorchFTDDP(Algorithm):
    cfg: DDPConfig

    def __init__(self, cfg: DDPConfig, world: World, group: ReplicaGroup, total_steps: int):
        super().__init__(cfg, world)
        self.group, self.total_steps = group, total_steps
        self.manager = None
        self._manager_state: dict[str, Any] | None = None  # from a checkpoint, applied once the manager exists
        self.dropped_steps = 0

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel
        from torchft.process_group import ProcessGroupDummy

        self.manager = build_manager(
            self.world, self.group, lambda: self.trainer_state(), lambda s: self.load_trainer_state(s)
        )
        if self._manager_state is not None:
            self.manager.load_state_dict(self._manager_state)
        # torchft.ddp.DistributedDataParallel's construction: a dummy group soaks up DDP's init broadcast
        # (the Manager syncs the start instead) and buckets are never rebuilt (a healed group must match);
        # our hook adds the intra-group mean for groups of several ranks and survives a failed collective.
        ddp = DistributedDataParallel(
            model,
            process_group=ProcessGroupDummy(0, 1),
            find_unused_parameters=True,
            bucket_cap_mb=self.cfg.bucket_cap_mb,
            gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
        )
        several = self.world.is_distributed and self.world.world_size > 1
        intra = (self.world.group or dist.group.WORLD) if several else None
        ddp.register_comm_hook(self.manager, group_then_replicas_hook(intra, self.world.world_size))
        return ddp

    def no_sync(self, model: torch.nn.Module):
        return model.no_sync()

    def on_train_start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        inner_step = optimizer.step

        def committed_step(*args, **kwargs):  # torchft.optim.OptimizerWrapper's rule, on the engine's own optimizer
            if self.manager.should_commit():
                return inner_step(*args, **kwargs)
            self.dropped_steps += 1
            log.warning("step dropped: the replica groups did not commit it (a peer failed mid-step)")
            return None

        optimizer.step = committed_step
        self.manager.start_quorum()  # the first step's quorum; init_sync makes every group start from one state

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        metrics = {**ft_metrics(self.manager), "ft/dropped_steps": float(self.dropped_steps)}
        if step < self.total_steps:
            # before the next batch is drawn: a healed group reads on from the peer's position
            self.manager.start_quorum()
        return metrics

    def on_train_end(self, model: torch.nn.Module) -> None:
        self.manager.shutdown(wait=False)

    def state_dict(self) -> dict[str, Any]:
        return {"torchft": self.manager.state_dict() if self.manager is not None else self._manager_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._manager_state = state.get("torchft")
        if self.manager is not None and self._manager_state is not None:
            self.manager.load_state_dict(self._manager_state)
