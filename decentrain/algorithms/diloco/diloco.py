"""DiLoCo (arXiv 2311.08105): H inner steps, then one all-reduce of the pseudo-gradient.

Like torchft's DiLoCo it is only optimizer-step hooks: the trainer's AdamW is the
inner optimizer; every H steps `outer_step` averages Δ = θ_prev − θ_i over replicas,
takes an outer step on the fp32 slow weights (`algorithm.outer_optimizer`, by default
Nesterov SGD) and copies them back. With `algorithm.overlap=true` the all-reduce of round r
runs during round r+1 and lands at its end, one outer step late (outer/overlap.py).

`algorithm.rounds.mode` picks how a round closes (outer/rounds.py): `lockstep` (the all-reduce above,
every replica every round) or `quorum` (outer/quorum.py: at min_quorum deliveries once an adaptive
deadline passed, or when every live replica delivered; token-weighted; a replica that missed a round
applies it at its next sync). Δ travels to the board as its flat fp32 bytes (`DenseMean`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.algorithms.outer.overlap import DelayedOuter, check_overlap
from decentrain.algorithms.outer.quorum import RoundsConfig, rounds_config
from decentrain.algorithms.outer.rounds import RoundStrategy, build_rounds, check_rounds
from decentrain.algorithms.outer.updates import OuterOptimizer
from decentrain.algorithms.pretraining.inner_outer import InnerOuterAlgorithm, InnerOuterConfig
from decentrain.core.comm.transport import PendingMean


@dataclass
class DiLoCoConfig(InnerOuterConfig):
    name: str = "diloco"
    inner_steps: int = 500  # paper: H=500, η=0.7, μ=0.9 (Nesterov)
    # sgd: Nesterov at μ > 0
    outer_optimizer: OuterOptimizerConfig = field(default_factory=lambda: OuterOptimizerConfig("sgd", 0.7, 0.9))
    # one-step-delayed outer update: round r's all-reduce overlaps round r+1's inner steps (outer/overlap.py)
    overlap: bool = False
    # how a round closes: lockstep (every replica, an all-reduce) or quorum (outer/quorum.py)
    rounds: RoundsConfig = field(default_factory=RoundsConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_overlap(self)
        self.rounds = rounds_config(self.rounds)
        check_rounds(self.rounds, overlap=self.overlap, pacing=self.adaptive_inner_steps)


class DenseMean:
    """DiLoCo's payload, Δ as fp32 tensors: the all-reduce mean, or the mean of flat fp32 bytes off the board
    summed in the record's order and divided by the members kept (the all-reduce's rank-order sum when every
    replica is a member, as the in-process transport sums)."""

    def __init__(self, algo: "DiLoCo"):
        self.algo = algo
        self.like = [torch.empty(s.shape, dtype=torch.float32) for s in algo.outer.slow]
        self.numel = sum(t.numel() for t in self.like)
        self.bad_payloads = 0  # board payloads of the wrong size

    def to_bytes(self, delta: list[torch.Tensor]) -> bytes:
        return _flatten_dense_tensors([t.detach().float().cpu() for t in delta]).numpy().tobytes()

    def collective(self, delta: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, float]]:
        pending = self.algo.transport.start_mean(delta)
        return pending.result(), {"outer/payload_bytes": float(pending.payload_bytes)}

    def merge(self, parts: list[tuple[bytes, float, int]]) -> tuple[list[torch.Tensor], dict[str, float]]:
        device = self.algo.outer.slow[0].device
        total, kept = None, 0
        for data, scale, _ in parts:
            if len(data) != 4 * self.numel:  # a size check before any tensor is made of it
                self.bad_payloads += 1
                continue
            flat = torch.frombuffer(bytearray(data), dtype=torch.float32).to(device)
            flat = flat if scale == 1.0 else flat * scale
            total = flat.clone() if total is None else total.add_(flat)
            kept += 1
        if total is None:  # nothing usable: no move this round
            total, kept = torch.zeros(self.numel, dtype=torch.float32, device=device), 1
        metrics = {"outer/payload_bytes": float(4 * self.numel), "quorum/payload_dropped": float(self.bad_payloads)}
        return list(_unflatten_dense_tensors(total / kept, [t.to(device) for t in self.like])), metrics

    def left_out(self, delta: list[torch.Tensor]) -> None:
        pass  # θ is reset to φ after the sync: the late Δ is gone with it


@ALGORITHMS.register("diloco", config=DiLoCoConfig)
class DiLoCo(InnerOuterAlgorithm):
    cfg: DiLoCoConfig

    def setup(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.outer = OuterOptimizer(self.params, self.cfg.outer_optimizer)
        self.delayed = DelayedOuter(self.params) if self.cfg.overlap else None
        self.in_flight: PendingMean | None = None  # overlap: the mean of the last round's Δ, still travelling
        self.sync: RoundStrategy = build_rounds(
            self.cfg.rounds, self.world.rank, self.world.world_size, self.transport, DenseMean(self)
        )
        self.sync.start()

    @classmethod
    def check_world(cls, cfg: DiLoCoConfig, world_size: int) -> None:
        cfg.rounds.check_world(world_size)

    def outer_step(self, model: torch.nn.Module) -> dict[str, float]:
        if self.delayed is not None:
            metrics = self._land()  # round r−1's mean, one round late
            self.delayed.correct(self.params, self.outer.slow)  # θ ← φ + (θ − b) ; b ← θ
            return {**metrics, **self._send(), "outer/round": float(self.round + 1)}
        delta = self.outer.pseudo_gradient(self.params)
        synced = self.sync.exchange(delta, self.inner_count, self.round)
        if self.cfg.adaptive_inner_steps:
            self._share_pace()
        for mean in synced.updates:  # lockstep: one; quorum: every round closed since this replica's last sync
            self.outer.step(mean)
        self.outer.copy_to(self.params)
        self.round += len(synced.updates) - 1  # the loop counts one
        metrics = dict(synced.metrics)
        if synced.updates:
            metrics["outer/pseudo_grad_norm"] = torch.sqrt(
                sum((d.double() ** 2).sum() for d in synced.updates[-1])
            ).item()
        return {**metrics, "outer/round": float(self.round + 1)}

    def should_stop(self, step: int, total_steps: int) -> bool:
        return super().should_stop(step, total_steps) or self.sync.stops(self.round, total_steps, self.cfg.inner_steps)

    def _send(self) -> dict[str, float]:
        """Start the mean of this round's Δ = φ − b (= φ − θ just after the correction)."""
        self.in_flight = self.transport.start_mean(self.outer.pseudo_gradient(self.delayed.base))
        return {"outer/payload_bytes": float(self.in_flight.payload_bytes)}

    def _land(self) -> dict[str, float]:
        if self.in_flight is None:
            return {}
        mean, self.in_flight = self.in_flight.result(), None
        self.outer.step(mean)
        return {"outer/pseudo_grad_norm": torch.sqrt(sum((d.double() ** 2).sum() for d in mean)).item()}

    def drain(self, model: torch.nn.Module) -> dict[str, float]:
        if self.delayed is None:  # quorum rounds this replica has not applied yet (lockstep: none)
            synced = self.sync.drain(self.round)
            for mean in synced.updates:
                self.outer.step(mean)
            if synced.updates:
                self.outer.copy_to(self.params)
                self.round += len(synced.updates)
            return synced.metrics
        if self.in_flight is None:
            return {}
        metrics = self._land()
        self.delayed.correct(self.params, self.outer.slow)
        return metrics

    def on_train_end(self, model: torch.nn.Module) -> None:
        if self.in_flight is not None:  # stopped early (train.stop_at): never leave a collective in flight
            self.in_flight.result()
            self.in_flight = None
        self.sync.finish()

    def _share_pace(self) -> None:
        # DiLoCo syncs everybody anyway: one tiny MIN all-reduce tells all replicas the fastest step time.
        self.pace.hear(self.transport.all_reduce_min(self.pace.step_time))

    def outer_state(self) -> dict[str, Any]:
        state = self.outer.state_dict()
        if self.delayed is not None:  # the payload in flight is rebuilt from b and φ: nothing waits for it
            state["delayed"] = {**self.delayed.state_dict(), "in_flight": self.in_flight is not None}
        return state

    def load_outer_state(self, state: dict[str, Any]) -> None:
        delayed = state.get("delayed")
        if delayed is not None and delayed["in_flight"] and self.delayed is None:
            raise ValueError(
                "the checkpoint has an overlapped outer step in flight; resume with algorithm.overlap=true"
            )
        self.outer.load_state_dict(state)
        if self.delayed is not None and delayed is not None:
            self.delayed.load_state_dict(delayed)
            if delayed["in_flight"]:  # every replica resumes at the same step and sends it again
                self._send()
