"""Outer optimizers: the rule that moves the slow weights φ, picked by `algorithm.outer_optimizer.name`.

As in torchft's DiLoCo, an outer optimizer is an ordinary `torch.optim.Optimizer` over the fp32
slow weights: the family writes the pseudo-gradient into `.grad` (DiLoCo: the replicas' mean
Δ̄ = φ − mean θ; NoLoCo: φ_i − θ̄ over its gossip group) and steps it (outer/updates.py's
`OuterOptimizer` does that). Each entry owns its config class (the common η and μ plus its own
fields: no union of every rule's keys), checks it when the config is built and builds its
optimizer. Adding one: a class registered here (with its config class if it has fields of its
own), plus conf/algorithm/outer_optimizer/<name>.yaml (`defaults: [<name>_schema]`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from decentrain.core.config_checks import check_range
from decentrain.core.registry import Registry

FIELD = "algorithm.outer_optimizer"
DEFAULT_RULE = "sgd"  # outside any algorithm (a bare OuterOptimizer): DiLoCo's


@dataclass
class OuterOptimizerConfig:
    """The `algorithm.outer_optimizer` fields every rule has; an entry's config class adds its own.

    An instance of this class naming a rule with fields of its own (an algorithm's default, which
    any entry's schema can extend under Hydra) becomes that rule's class in `convert`.
    One without a name (`OuterOptimizerConfig(lr=0.5)`) takes the algorithm's own rule there: a
    default rule name here would switch NoLoCo to Nesterov SGD whenever a section left it out.
    """

    name: str | None = None  # None: the algorithm's rule (its default's name), sgd outside any algorithm
    lr: float = 0.7  # η
    momentum: float = 0.9  # μ

    def __post_init__(self) -> None:
        if self.name is None:  # typed once the algorithm's rule is known (convert)
            return
        rule = OUTER_OPTIMIZERS.get(self.name, field=f"{FIELD}.name")
        if type(self) is rule.config_cls:  # the rule's own class: complete, so check it
            rule.check(self)

    @classmethod
    def convert(
        cls,
        raw: Mapping[str, Any] | OuterOptimizerConfig,
        where: str = FIELD,
        default: OuterOptimizerConfig | None = None,
    ) -> OuterOptimizerConfig:
        """The section typed by its rule's own class. The rule is `default`'s (the algorithm's) unless the
        section names another; fields not given come from `default` (the algorithm's η and μ) where it has
        them; a field the rule does not have fails (core/registry.Registry.config)."""
        fill = default if default is not None else OuterOptimizerConfig(DEFAULT_RULE)
        return OUTER_OPTIMIZERS.config(raw, where, default_name=fill.name or DEFAULT_RULE, fill=fill)


class OuterRule:
    """One registry entry: its config class and checks, and the optimizer it builds over the slow weights."""

    config_cls: type[OuterOptimizerConfig] = OuterOptimizerConfig  # OUTER_OPTIMIZERS.register(name, config=...)

    # True when `build` returns an optimizer with NoLoCo's momentum buffer m (φ ← φ + m), which
    # NoLoCo's general form (γ ≠ β) updates itself
    noloco_momentum: bool = False

    @classmethod
    def check(cls, cfg: OuterOptimizerConfig) -> None:
        # (0, 4]: catches a typo (7 for 0.7) yet leaves room to extrapolate; SparseLoCo's tuned lr on
        # a short run sat at 2, the old bound (benchmarks/compressed_sync.py brackets above it)
        check_range(f"{FIELD}.lr", cfg.lr, 0, 4, low_open=True)
        check_range(f"{FIELD}.momentum", cfg.momentum, 0, 1, high_open=True)

    @classmethod
    def build(cls, params: Sequence[Tensor], cfg: OuterOptimizerConfig) -> torch.optim.Optimizer:
        raise NotImplementedError


# each rule registers itself, with its own config class where it has fields of its own
OUTER_OPTIMIZERS: Registry[type[OuterRule]] = Registry(FIELD, config=OuterOptimizerConfig)


@dataclass
class SGDConfig(OuterOptimizerConfig):
    name: str = "sgd"
    nesterov: bool | None = None  # None: Nesterov when momentum > 0 (DiLoCo's), plain SGD at momentum 0

    def __post_init__(self) -> None:
        if self.nesterov is None:
            self.nesterov = self.momentum > 0
        super().__post_init__()


@OUTER_OPTIMIZERS.register("sgd", config=SGDConfig)
class SGDRule(OuterRule):
    """torch.optim.SGD: Nesterov (DiLoCo's) or, with nesterov=false, heavy-ball momentum (the
    NoLoCo paper's DiLoCo baseline, the official code's pipeline_diloco_optimizer):
        b ← μ·b + g ;  φ ← φ − η·(g + μ·b)  (Nesterov)  or  φ ← φ − η·b  (heavy ball)
    """

    @classmethod
    def check(cls, cfg: OuterOptimizerConfig) -> None:
        super().check(cfg)
        if cfg.nesterov and cfg.momentum == 0:
            raise ValueError(f"{FIELD}.nesterov=true needs {FIELD}.momentum > 0 (or set {FIELD}.nesterov=false)")

    @classmethod
    def build(cls, params, cfg):
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)


class NoLoCoMomentum(torch.optim.Optimizer):
    """The NoLoCo paper's outer step on the gradient g = φ − θ̄ (β = γ = η):
        m ← μ·m − η·g ;  φ ← φ + m
    Heavy-ball momentum with m = −η·b, written as the paper writes it (and rounded as
    outer/updates.py's `noloco_step_`, bit for bit: −η·(φ − θ̄) is exactly η·(θ̄ − φ)).
    """

    def __init__(self, params: Sequence[Tensor], lr: float, momentum: float):
        super().__init__(params, {"lr": lr, "momentum": momentum})

    def buffers(self) -> list[Tensor]:
        """m for every parameter, created (zero) on first use."""
        out = []
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                out.append(state["momentum_buffer"])
        return out

    @torch.no_grad()
    def step(self, closure=None):
        ms = iter(self.buffers())
        for group in self.param_groups:
            for p in group["params"]:
                m = next(ms)
                if p.grad is not None:
                    m.mul_(group["momentum"]).add_(p.grad, alpha=-group["lr"])
                    p.add_(m)


@OUTER_OPTIMIZERS.register("noloco")
class NoLoCoRule(OuterRule):
    noloco_momentum = True

    @classmethod
    def build(cls, params, cfg):
        return NoLoCoMomentum(params, lr=cfg.lr, momentum=cfg.momentum)


@dataclass
class AdamConfig(OuterOptimizerConfig):
    name: str = "adam"
    lr: float = 0.01  # ~lr per coordinate per outer step
    beta2: float = 0.999  # momentum is beta1


@OUTER_OPTIMIZERS.register("adam", config=AdamConfig)
class AdamRule(OuterRule):
    """torch.optim.Adam on the pseudo-gradient, betas (momentum, beta2): the adaptive outer step some
    DiLoCo follow-ups use. Its step is ~lr per coordinate whatever Δ's scale, so lr is far below SGD's."""

    @classmethod
    def check(cls, cfg: OuterOptimizerConfig) -> None:
        check_range(f"{FIELD}.lr", cfg.lr, 0, 1, low_open=True)
        check_range(f"{FIELD}.momentum", cfg.momentum, 0, 1, high_open=True)
        check_range(f"{FIELD}.beta2", cfg.beta2, 0, 1, high_open=True)

    @classmethod
    def build(cls, params, cfg):
        return torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.momentum, cfg.beta2))
