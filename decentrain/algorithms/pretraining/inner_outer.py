"""The inner/outer loop shared by DiLoCo and NoLoCo, as optimizer-step hooks.

The trainer runs ordinary inner AdamW steps; this base class counts them and, every
H steps, calls the family's `outer_step`. It also owns what every replica algorithm
needs around that: the start-up shape check and weight broadcast, resume of outer
state (loaded before the model is wrapped, applied once the outer state exists), and
optional FedCompass-style adaptive H for mixed hardware.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from decentrain.algorithms.base import Algorithm, AlgorithmConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.algorithms.pretraining.precision import DeviceTimer
from decentrain.algorithms.pretraining.replicas import broadcast_parameters, check_replicas_match
from decentrain.algorithms.pretraining.transports import DEFAULT_TRANSPORT, TRANSPORTS, TransportConfig
from decentrain.core.comm.transport import Transport


@dataclass
class InnerOuterConfig(AlgorithmConfig):
    inner_steps: int = 50  # H: inner optimizer steps between outer steps
    outer_optimizer: OuterOptimizerConfig = field(default_factory=OuterOptimizerConfig)  # η, μ and the rule
    # FedCompass-like pacing: a slow worker runs fewer inner steps per round, so that
    # partners reach the sync together; every worker still runs the same number of rounds.
    adaptive_inner_steps: bool = False
    min_inner_steps: int = 1
    # the flat keys from before algorithm.outer_optimizer; the message says that the section keeps the
    # algorithm's rule, so that writing `outer_optimizer: {lr: ...}` is never read as a switch of rule
    RENAMED: ClassVar[dict[str, str]] = {
        "outer_lr": "outer_optimizer.lr (the algorithm's rule is kept unless outer_optimizer.name names another)",
        "outer_momentum": (
            "outer_optimizer.momentum (the algorithm's rule is kept unless outer_optimizer.name names another)"
        ),
        "nesterov": "outer_optimizer.nesterov (a field of outer_optimizer.name=sgd only)",
    }

    def __post_init__(self) -> None:
        if self.inner_steps < 1:
            raise ValueError(f"algorithm.inner_steps={self.inner_steps} (H) must be >= 1")
        # the rule's own config class (from a dict, or a default naming the rule), η and μ defaulting to ours
        default = type(self).__dataclass_fields__["outer_optimizer"].default_factory()
        self.outer_optimizer = OuterOptimizerConfig.convert(self.outer_optimizer, default=default)
        if not 1 <= self.min_inner_steps <= self.inner_steps:
            raise ValueError(
                f"algorithm.min_inner_steps={self.min_inner_steps} must be in "
                f"[1, algorithm.inner_steps={self.inner_steps}]"
            )


class StepPace:
    """Median of recent inner-step times, and H scaled to the fastest known worker."""

    def __init__(self, window: int = 16):
        self.times: deque[float] = deque(maxlen=window)
        self.fastest: float = math.inf  # step time of the fastest worker heard of (self included)

    def observe(self, seconds: float) -> None:
        self.times.append(seconds)

    @property
    def step_time(self) -> float:
        return statistics.median(self.times) if self.times else math.inf

    def hear(self, step_time: float) -> None:
        self.fastest = min(self.fastest, step_time, self.step_time)

    def inner_steps(self, h: int, h_min: int) -> int:
        """H · s_fastest / s_self, clamped to [h_min, H]: a worker 2× slower does H/2 steps."""
        if not math.isfinite(self.fastest) or not math.isfinite(self.step_time) or self.step_time <= 0:
            return h
        return max(h_min, min(h, round(h * self.fastest / self.step_time)))


class InnerOuterAlgorithm(Algorithm):
    """Subclasses implement `setup(model)`, `outer_step(model) -> metrics` and the outer state."""

    cfg: InnerOuterConfig
    _transport: Transport | None = None

    @property
    def transport(self) -> Transport:
        """How this replica talks to the others: set by the run's transport spec (pretraining/transports/,
        `transport.name`) before on_train_start; unset (an algorithm built by hand), the default transport's."""
        if self._transport is None:
            self._transport = TRANSPORTS.get(DEFAULT_TRANSPORT).connect(self.world, TransportConfig())
        return self._transport

    @transport.setter
    def transport(self, transport: Transport) -> None:
        self._transport = transport

    def bytes_sent(self) -> int | None:
        return self.transport.stats.bytes_sent  # the transport counts every operation

    @classmethod
    def check_steps(cls, cfg: InnerOuterConfig, steps: int) -> None:
        if cfg.adaptive_inner_steps and steps % cfg.inner_steps:
            # paced workers stop after the same number of rounds; a partial last round would
            # leave the fastest worker gone while slower ones wait in the final exchange
            raise ValueError(
                f"train.steps={steps} must be a multiple of algorithm.inner_steps={cfg.inner_steps} "
                "with algorithm.adaptive_inner_steps=true"
            )

    def __init__(self, cfg: InnerOuterConfig, world):
        super().__init__(cfg, world)
        self.round = 0  # outer steps taken
        self.inner_count = 0  # inner steps since the last outer step
        self.h = cfg.inner_steps  # this round's H (differs from cfg only when adaptive)
        self.pace = StepPace()
        self._resume: dict[str, Any] | None = None
        self.timer = DeviceTimer(world.device)  # device time, not launch time; read only when pacing

    # -- hooks the families fill in ---------------------------------------------------
    def setup(self, model: torch.nn.Module) -> None:
        raise NotImplementedError

    def outer_step(self, model: torch.nn.Module) -> dict[str, float]:
        raise NotImplementedError

    def outer_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_outer_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- Algorithm hooks --------------------------------------------------------------
    def heal(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """A replacement (world.incarnation > 0) pulls the training state from a live peer."""
        raise RuntimeError(f"{type(self).__name__} cannot heal a replacement worker; restart the job to resume")

    def on_train_start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        healing = self.world.incarnation > 0  # a replacement: in no world group, so no start-up collective
        if not healing:
            check_replicas_match(self.world, model)
            if self._resume is None:  # a resumed replica keeps its own (possibly distinct) weights
                broadcast_parameters(self.world, model)
        self.setup(model)
        if healing:
            self.heal(model, optimizer)  # loads the trainer's state; the outer part lands in _resume
        if self._resume is not None:
            self.load_outer_state(self._resume["outer"])
            self._resume = None
        self.timer.start()

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        if self.cfg.adaptive_inner_steps:  # reading a CUDA timer waits for the step: only when pacing uses it
            self.pace.observe(self.timer.stop())
        self.inner_count += 1
        metrics: dict[str, float] = {}
        if self.inner_count >= self.h:
            metrics = self.outer_step(model)
            self.round += 1
            self.inner_count = 0
            if self.cfg.adaptive_inner_steps:
                self.h = self.pace.inner_steps(self.cfg.inner_steps, self.cfg.min_inner_steps)
                metrics["outer/inner_steps"] = float(self.h)
        self.timer.start()  # the sync itself is not compute time
        return metrics

    def should_stop(self, step: int, total_steps: int) -> bool:
        # Adaptive workers take different numbers of inner steps but the same number of rounds.
        return self.cfg.adaptive_inner_steps and self.round >= math.ceil(total_steps / self.cfg.inner_steps)

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "inner_count": self.inner_count,
            "h": self.h,
            "fastest": self.pace.fastest if math.isfinite(self.pace.fastest) else None,
            "outer": self.outer_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round, self.inner_count, self.h = int(state["round"]), int(state["inner_count"]), int(state["h"])
        self.pace.fastest = math.inf if state.get("fastest") is None else float(state["fastest"])
        self._resume = state  # the outer state needs the model; applied in on_train_start
