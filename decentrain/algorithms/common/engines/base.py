"""Inner engines: how one replica turns micro-batch losses into an optimizer step.

`torch` is the plain path (AdamW + LambdaLR on every rank, gradients averaged by the
algorithm's wrapper, e.g. DDP). `deepspeed` runs ZeRO-1/2 over the ranks of one replica
(see core/mesh.py): optimizer state (and with stage 2 gradients) are sharded, parameters
stay whole on every rank, so the outer algorithms can average them as usual.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from decentrain.algorithms.base import Algorithm
from decentrain.core.checks import check_range
from decentrain.core.mesh import ReplicaLayout
from decentrain.core.registry import Registry

ZERO_STAGES = (1, 2)
SCHEDULES = ("cosine", "constant")


@dataclass
class OptimConfig:
    """The inner AdamW and its LR schedule (the `optim` section; see build_optimizer)."""

    lr: float = 2e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_steps: int = 10
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping

    def __post_init__(self) -> None:
        check_range("optim.lr", self.lr, 0, 1, low_open=True)  # AdamW above 1 only diverges
        check_range("optim.weight_decay", self.weight_decay, 0, 1)
        if len(self.betas) != 2:
            raise ValueError(f"optim.betas={list(self.betas)} must be two numbers, each in [0, 1)")
        for i, b in enumerate(self.betas):
            check_range(f"optim.betas[{i}]", b, 0, 1, high_open=True)
        check_range("optim.min_lr_ratio", self.min_lr_ratio, 0, 1)
        check_range("optim.grad_clip", self.grad_clip, 0)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r} is unknown; allowed: {list(SCHEDULES)}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={self.warmup_steps} must be >= 0")


@dataclass
class EngineConfig:
    name: str = "torch"
    zero_stage: int = 2  # deepspeed only
    shards_per_replica: int = 1  # ranks per replica; the inner engine shards across them

    def __post_init__(self) -> None:
        if self.name not in ENGINES.names():
            raise ValueError(f"engine.name={self.name!r} is unknown; allowed: {ENGINES.names()}")
        if self.shards_per_replica < 1:
            raise ValueError(f"engine.shards_per_replica={self.shards_per_replica} must be >= 1")
        if self.name == "torch" and self.shards_per_replica != 1:
            raise ValueError(f"engine.shards_per_replica={self.shards_per_replica}: engine=torch does not shard; "
                             "use 1, or engine=deepspeed_zero1/2")
        if self.name == "fsdp2" and self.shards_per_replica < 2:
            raise ValueError(f"engine.shards_per_replica={self.shards_per_replica}: engine=fsdp2 shards a replica over "
                             ">= 2 ranks; use engine=torch for one rank per replica")
        if self.name == "deepspeed":
            if self.zero_stage == 3:
                raise ValueError("engine.zero_stage=3 partitions the parameters themselves, which the outer "
                                 f"algorithms cannot average; allowed: {list(ZERO_STAGES)}")
            if self.zero_stage not in ZERO_STAGES:
                raise ValueError(f"engine.zero_stage={self.zero_stage} is unknown; allowed: {list(ZERO_STAGES)}")
            if importlib.util.find_spec("deepspeed") is None:
                raise ValueError("engine.name='deepspeed' needs the deepspeed package (pip install deepspeed)")


def lr_factor(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """Linear warm-up, then constant or cosine down to min_lr_ratio."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int, fused: bool | None = None):
    """AdamW + LambdaLR. `fused`: one kernel per step; None picks it when every parameter is on CUDA."""
    # no weight decay on norms and biases (1-D tensors), as in most LM recipes
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=tuple(cfg.betas),
        fused=all(p.is_cuda for p in decay + no_decay) if fused is None else fused,
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg, total_steps))


class Engine:
    """One replica's backward and optimizer step. `forward_model` is what the loop calls."""

    forward_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    whole_model_state = True  # the per-rank checkpoint holds model.state_dict(); False: the engine saves it
    checkpoint_dir: Path | None = None  # <run_dir>/checkpoints, set by the Trainer (sharded engines write under it)

    def __init__(self, cfg, layout: ReplicaLayout, model: torch.nn.Module, accum: int):
        """cfg: the TrainConfig; `model` is already on the device."""
        self.cfg, self.layout, self.model, self.accum = cfg, layout, model, accum

    def prepare(self, algorithm: Algorithm) -> None:
        """Wrap the model for training; called once, at the start of fit."""

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """One micro-batch (`loss` already divided by the accumulation count)."""
        raise NotImplementedError

    def step(self) -> None:
        """After the last micro-batch: clip, optimizer step, LR schedule, zero grads."""
        raise NotImplementedError

    def weights_changed(self) -> None:
        """The algorithm may have rewritten the parameters in place (an outer step)."""

    @property
    def outer_model(self):
        """What the outer algorithm's hooks see: the module itself, or (sharded engines) a view of its shards."""
        return self.model

    def save_sharded(self, step: int) -> None:
        """Write the engine's own sharded checkpoint of `step` (collective); before the per-rank one."""

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Whole weights for save_pretrained (collective for sharded engines); None: use the module."""
        return None

    def lr(self) -> float:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


ENGINES: Registry[type[Engine]] = Registry("engine.name")


@ENGINES.register("torch")
class TorchEngine(Engine):
    def __init__(self, cfg, layout, model, accum):
        super().__init__(cfg, layout, model, accum)
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim, cfg.train.steps)
        self.forward_model = model

    def prepare(self, algorithm: Algorithm) -> None:
        self.forward_model = algorithm.wrap_model(self.model)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self) -> None:
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


class _ReplicaMPU:
    """DeepSpeed's 'model parallel unit': data parallel = this replica's ranks, no model parallel."""

    def __init__(self, layout: ReplicaLayout, self_group: dist.ProcessGroup):
        self.layout, self.self_group = layout, self_group

    def get_data_parallel_group(self):
        return self.layout.shard_group

    def get_data_parallel_world_size(self) -> int:
        return self.layout.shards

    def get_data_parallel_rank(self) -> int:
        return self.layout.shard

    def get_model_parallel_group(self):
        return self.self_group

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def _singleton_groups(world_size: int, rank: int) -> dist.ProcessGroup:
    # new_group is collective over the whole world: every rank creates every group, in order
    groups = [dist.new_group([r]) for r in range(world_size)]
    return groups[rank]


@ENGINES.register("deepspeed")
class DeepSpeedEngine(Engine):
    """ZeRO-1/2 inside a replica. On CPU it runs over gloo with DeepSpeed's cpu accelerator."""

    def __init__(self, cfg, layout, model, accum):
        super().__init__(cfg, layout, model, accum)
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # the first initialize JIT-builds a comm op (~40 s on CPU); cache it across runs
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/decentrain/torch_extensions"))
        import deepspeed

        world_size = layout.replicas * layout.shards
        global_rank = layout.replica * layout.shards + layout.shard
        mpu = _ReplicaMPU(layout, _singleton_groups(world_size, global_rank)) if dist.is_initialized() else None
        # our own AdamW + LambdaLR (ZeRO supports torch.optim.AdamW): the same update and
        # schedule as engine=torch, and no fused-Adam build
        optimizer, scheduler = build_optimizer(model, cfg.optim, cfg.train.steps, fused=False)
        ds_config = {
            "train_micro_batch_size_per_gpu": cfg.train.micro_batch_size,
            "gradient_accumulation_steps": accum,
            "gradient_clipping": cfg.optim.grad_clip,
            "zero_optimization": {"stage": cfg.engine.zero_stage},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config, mpu=mpu, dist_init_required=False)
        self.forward_model = self.ds

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        # the loop owns accumulation: tell ZeRO which micro-batch reduces the gradients
        self.ds.set_gradient_accumulation_boundary(last)
        self.ds.backward(loss, scale_wrt_gas=False)

    def step(self) -> None:
        self.ds.step()  # clips, steps the ZeRO optimizer and the LR schedule, zeroes grads

    def weights_changed(self) -> None:
        # ZeRO keeps an fp32 master copy of this rank's partition; after an outer step the
        # module's parameters are the truth. An O(params) copy per step, cheap beside Adam.
        self.ds.optimizer.refresh_fp32_params()

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    # -- checkpoints: ZeRO's partitioned optimizer state through DeepSpeed's own checkpointing
    def _ds_dir(self) -> Path:
        if self.checkpoint_dir is None:
            raise ValueError("engine=deepspeed: no checkpoint directory was set")
        return self.checkpoint_dir / "deepspeed" / f"replica_{self.layout.replica}"

    def save_sharded(self, step: int) -> None:
        """Every rank writes its ZeRO partition (collective); one directory per replica, tag = step."""
        self._ds_dir().mkdir(parents=True, exist_ok=True)  # DeepSpeed makes it on global rank 0 only
        self.ds.save_checkpoint(str(self._ds_dir()), tag=f"step_{step:08d}", save_latest=False)
        if self.layout.shard == 0:
            tags = sorted(d for d in self._ds_dir().glob("step_*") if d.is_dir())
            for old in tags[: max(0, len(tags) - self.cfg.train.keep_checkpoints)]:
                shutil.rmtree(old, ignore_errors=True)

    def state_dict(self) -> dict[str, Any]:
        # the module's weights are in the per-rank checkpoint; optimizer partitions in save_sharded's
        return {"engine": "deepspeed", "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("engine") != "deepspeed":
            raise ValueError(f"engine=deepspeed cannot resume a checkpoint of engine {state.get('engine', 'torch')!r}; "
                             "use the same engine or a fresh run_dir")
        tag = f"step_{int(state['step']):08d}"
        if not (self._ds_dir() / tag).is_dir():
            raise ValueError(f"engine=deepspeed: {self._ds_dir() / tag} is missing (a checkpoint from before ZeRO "
                             "state was saved); use a fresh run_dir or resume=false")
        self.ds.load_checkpoint(str(self._ds_dir()), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        self.scheduler.load_state_dict(state["scheduler"])


# registers engine=fsdp2 (imported last: it subclasses Engine from this module)
from decentrain.algorithms.common.engines import fsdp2  # noqa: E402,F401
