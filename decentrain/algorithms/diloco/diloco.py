"""DiLoCo (arXiv 2311.08105): H inner steps, then one all-reduce of the pseudo-gradient.

Like torchft's DiLoCo it is only optimizer-step hooks: the trainer's AdamW is the
inner optimizer; every H steps `outer_step` averages Δ = θ_prev − θ_i over replicas,
takes an outer step on the fp32 slow weights (`algorithm.outer_optimizer`, by default
Nesterov SGD) and copies them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from decentrain.algorithms.base import register_algorithm
from decentrain.algorithms.common.inner_outer import InnerOuterAlgorithm, InnerOuterConfig
from decentrain.algorithms.common.outer import OuterOptimizer
from decentrain.algorithms.common.outer_optimizers import OuterOptimizerConfig


@dataclass
class DiLoCoConfig(InnerOuterConfig):
    name: str = "diloco"
    inner_steps: int = 500  # paper: H=500, η=0.7, μ=0.9 (Nesterov)
    outer_optimizer: OuterOptimizerConfig = field(default_factory=lambda: OuterOptimizerConfig("sgd", 0.7, 0.9, True))


@register_algorithm("diloco", DiLoCoConfig)
class DiLoCo(InnerOuterAlgorithm):
    cfg: DiLoCoConfig

    def setup(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.outer = OuterOptimizer(self.params, self.cfg.outer_optimizer)

    def outer_step(self, model: torch.nn.Module) -> dict[str, float]:
        delta = self.outer.pseudo_gradient(self.params)
        mean = self.comm().start_mean(delta).result()
        if self.cfg.adaptive_inner_steps:
            self._share_pace()
        self.outer.step(mean)
        self.outer.copy_to(self.params)
        norm = torch.sqrt(sum((d.double() ** 2).sum() for d in mean)).item()
        return {"outer/pseudo_grad_norm": norm, "outer/round": float(self.round + 1)}

    def _share_pace(self) -> None:
        # DiLoCo syncs everybody anyway: one tiny MIN all-reduce tells all replicas the fastest step time.
        self.pace.hear(self.comm().all_reduce_min(self.pace.step_time))

    def outer_state(self) -> dict[str, Any]:
        return self.outer.state_dict()

    def load_outer_state(self, state: dict[str, Any]) -> None:
        self.outer.load_state_dict(state)
