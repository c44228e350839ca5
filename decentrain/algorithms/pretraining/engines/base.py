"""The engine interface, its registry, and the configs an engine is built from.

An inner engine is how one replica turns micro-batch losses into an optimizer step:
`torch` (engines/torch.py) is the plain path, `deepspeed` (ZeRO-1/2) and `fsdp2` shard a
replica over `engine.shards_per_replica` ranks (see core/mesh.py). Engines are picked by
`engine.name` from ENGINES; what each allows is a class attribute or `check_config`, so
this module names no engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from decentrain.algorithms.base import Algorithm
from decentrain.core.config_checks import check_range
from decentrain.core.mesh import ReplicaLayout
from decentrain.core.registry import Registry

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
    """The `engine` fields every engine has; an engine with fields of its own subclasses it (`Engine.config_cls`)."""

    name: str = "torch"
    shards_per_replica: int = 1  # ranks per replica; the inner engine shards across them

    def __post_init__(self) -> None:
        if self.shards_per_replica < 1:
            raise ValueError(f"engine.shards_per_replica={self.shards_per_replica} must be >= 1")
        engine = ENGINES.get(self.name, field="engine.name")
        if type(self) is engine.config_cls:  # the engine's own class: complete, so check it
            engine.check_config(self)

    @classmethod
    def convert(cls, raw: Mapping[str, Any], where: str = "engine", default: "EngineConfig | None" = None):
        """The section typed by its engine's own class (core/typed.py calls this for a registry-picked section)."""
        return ENGINES.config(raw, where)


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
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        fused=all(p.is_cuda for p in decay + no_decay) if fused is None else fused,
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg, total_steps))


class Engine:
    """One replica's backward and optimizer step. `forward_model` is what the loop calls.

    Built from its own sections: `engine`, `optim` (the inner AdamW) and the loop's `train`.
    """

    forward_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    whole_model_state = True  # the per-rank checkpoint holds model.state_dict(); False: the engine saves it
    checkpoint_dir: Path | None = None  # <run_dir>/checkpoints, set by the Trainer (sharded engines write under it)
    # engine.shards_per_replica this engine accepts, [min, max] (None: no upper bound)
    min_shards: int = 1
    max_shards: int | None = None
    # True: the engine shards state inside a replica and does not apply the algorithm's model wrapper,
    # so an algorithm that syncs every step (Algorithm.syncs_every_step, e.g. DDP) cannot run on it
    shards_replica: bool = True
    config_cls: type[EngineConfig] = EngineConfig  # ENGINES.register(name, config=...): the engine's own

    @classmethod
    def check_config(cls, cfg: EngineConfig) -> None:
        """Refuse a config this engine cannot run (ValueError, one line); called when the config is built."""
        low, high = cls.min_shards, cls.max_shards
        if cfg.shards_per_replica < low or (high is not None and cfg.shards_per_replica > high):
            allowed = f"[{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(
                f"engine.shards_per_replica={cfg.shards_per_replica} must be {allowed} with engine.name={cfg.name!r}"
            )

    def __init__(
        self,
        cfg: EngineConfig,
        optim: OptimConfig,
        loop: Any,
        layout: ReplicaLayout,
        model: torch.nn.Module,
        accum: int,
    ):
        """`loop`: the `train` section (pretraining/config.py's LoopConfig, which imports this module: typed Any
        to keep the import one way); `model` is already on the device; `accum` micro-batches make one step."""
        self.cfg, self.optim_cfg, self.loop = cfg, optim, loop
        self.layout, self.model, self.accum = layout, model, accum

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

    def all_ranks_agree(self, ok: bool) -> bool:
        """`ok` on every rank of this replica. A sharded save is collective over them: they must all
        save or all stop, or the one that stops leaves the others hanging inside the save."""
        if self.layout.shards == 1 or self.layout.shard_group is None:
            return ok
        flag = torch.tensor(0.0 if ok else 1.0, device=self.layout.outer.device)  # nccl needs it on the GPU
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.layout.shard_group)
        return not bool(flag)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Whole weights for save_pretrained (collective for sharded engines); None: use the module."""
        return None

    def lr(self) -> float:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


# each engine registers itself, with its own config class where it has fields of its own:
# @ENGINES.register("<name>", config=<Name>Config)
ENGINES: Registry[type[Engine]] = Registry("engine", config=EngineConfig)
