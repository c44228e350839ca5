"""DiLoCo (arXiv 2311.08105): H inner steps, then one all-reduce of the pseudo-gradient.

Like torchft's DiLoCo it is only optimizer-step hooks: the trainer's AdamW is the
inner optimizer; every H steps `outer_step` averages Δ = θ_prev − θ_i over replicas,
takes an outer step on the fp32 slow weights (`algorithm.outer_optimizer`, by default
Nesterov SGD) and copies them back. With `algorithm.overlap=true` the all-reduce of round r
runs during round r+1 and lands at its end, one outer step late (outer/overlap.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from decentrain.algorithms.base import register_algorithm
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.algorithms.outer.overlap import DelayedOuter, check_overlap
from decentrain.algorithms.outer.updates import OuterOptimizer
from decentrain.algorithms.pretraining.inner_outer import InnerOuterAlgorithm, InnerOuterConfig
from decentrain.core.comm.transport import PendingMean


@dataclass
class DiLoCoConfig(InnerOuterConfig):
    name: str = "diloco"
    inner_steps: int = 500  # paper: H=500, η=0.7, μ=0.9 (Nesterov)
    outer_optimizer: OuterOptimizerConfig = field(default_factory=lambda: OuterOptimizerConfig("sgd", 0.7, 0.9))  # sgd: Nesterov at μ > 0
    # one-step-delayed outer update: round r's all-reduce overlaps round r+1's inner steps (outer/overlap.py)
    overlap: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_overlap(self)


@register_algorithm("diloco", DiLoCoConfig)
class DiLoCo(InnerOuterAlgorithm):
    cfg: DiLoCoConfig

    def setup(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.outer = OuterOptimizer(self.params, self.cfg.outer_optimizer)
        self.delayed = DelayedOuter(self.params) if self.cfg.overlap else None
        self.in_flight: PendingMean | None = None  # overlap: the mean of the last round's Δ, still travelling

    def outer_step(self, model: torch.nn.Module) -> dict[str, float]:
        if self.delayed is not None:
            metrics = self._land()  # round r−1's mean, one round late
            self.delayed.correct(self.params, self.outer.slow)  # θ ← φ + (θ − b) ; b ← θ
            return {**metrics, **self._send(), "outer/round": float(self.round + 1)}
        delta = self.outer.pseudo_gradient(self.params)
        pending = self.comm().start_mean(delta)
        mean = pending.result()
        if self.cfg.adaptive_inner_steps:
            self._share_pace()
        self.outer.step(mean)
        self.outer.copy_to(self.params)
        norm = torch.sqrt(sum((d.double() ** 2).sum() for d in mean)).item()
        return {"outer/pseudo_grad_norm": norm, "outer/round": float(self.round + 1),
                "outer/payload_bytes": float(pending.payload_bytes)}

    def _send(self) -> dict[str, float]:
        """Start the mean of this round's Δ = φ − b (= φ − θ just after the correction)."""
        self.in_flight = self.comm().start_mean(self.outer.pseudo_gradient(self.delayed.base))
        return {"outer/payload_bytes": float(self.in_flight.payload_bytes)}

    def _land(self) -> dict[str, float]:
        if self.in_flight is None:
            return {}
        mean, self.in_flight = self.in_flight.result(), None
        self.outer.step(mean)
        return {"outer/pseudo_grad_norm": torch.sqrt(sum((d.double() ** 2).sum() for d in mean)).item()}

    def drain(self, model: torch.nn.Module) -> dict[str, float]:
        if self.delayed is None or self.in_flight is None:
            return {}
        metrics = self._land()
        self.delayed.correct(self.params, self.outer.slow)
        return metrics

    def on_train_end(self, model: torch.nn.Module) -> None:
        if self.in_flight is not None:  # stopped early (train.stop_at): never leave a collective in flight
            self.in_flight.result()
            self.in_flight = None

    def _share_pace(self) -> None:
        # DiLoCo syncs everybody anyway: one tiny MIN all-reduce tells all replicas the fastest step time.
        self.pace.hear(self.comm().all_reduce_min(self.pace.step_time))

    def outer_state(self) -> dict[str, Any]:
        state = self.outer.state_dict()
        if self.delayed is not None:  # the payload in flight is rebuilt from b and φ: nothing waits for it
            state["delayed"] = {**self.delayed.state_dict(), "in_flight": self.in_flight is not None}
        return state

    def load_outer_state(self, state: dict[str, Any]) -> None:
        delayed = state.get("delayed")
        if delayed is not None and delayed["in_flight"] and self.delayed is None:
            raise ValueError("the checkpoint has an overlapped outer step in flight; resume with algorithm.overlap=true")
        self.outer.load_state_dict(state)
        if self.delayed is not None and delayed is not None:
            self.delayed.load_state_dict(delayed)
            if delayed["in_flight"]:  # every replica resumes at the same step and sends it again
                self._send()
