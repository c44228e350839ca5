"""NoLoCo (arXiv 2506.10911): no all-reduce, one random partner per outer step.

Replica i keeps slow weights φ, momentum m (both fp32) and its fast weights θ (the
model). After H inner steps it averages θ with its gossip partner, the only
exchange, and moves:
    m ← μ·m + β·(θ̄_G − φ) ;  φ ← φ + m ;  θ ← φ           (γ = β, the default)
With γ ≠ β the paper's general form needs mean φ of the pair too, so φ is sent
alongside θ. Partners come from a seeded matching that every rank derives alone; a
partner that misses the deadline costs this round's averaging (the step uses θ̄ = θ).
After the start-up broadcast NoLoCo issues no all-reduce and no barrier. With
`algorithm.overlap=true` round r's exchange runs on a helper thread during round r+1 and
lands at its end, one outer step late (outer/overlap.py); a partner that has not delivered
by then (deadline_s from the send) costs that round's averaging only.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.noloco.compressed_gossip import (
    CompressedGossip,
    NoLoCoCompressionConfig,
    compressed_outer_step,
)
from decentrain.algorithms.noloco.healing import Healer, tensors_crc
from decentrain.algorithms.outer.optimizers import OUTER_OPTIMIZERS, OuterOptimizerConfig
from decentrain.algorithms.outer.overlap import Background, DelayedOuter, check_overlap
from decentrain.algorithms.outer.updates import OuterOptimizer, noloco_general_step_
from decentrain.algorithms.pretraining.inner_outer import InnerOuterAlgorithm, InnerOuterConfig
from decentrain.core.comm.deadline import AdaptiveDeadlineConfig
from decentrain.core.comm.pairing import ODD_POLICIES, gossip_groups, group_of
from decentrain.core.comm.transport import GossipOptions
from decentrain.core.comm.wait_policy import BEHIND
from decentrain.core.config_checks import check_range

log = logging.getLogger(__name__)


@dataclass
class NoLoCoConfig(InnerOuterConfig):
    name: str = "noloco"
    inner_steps: int = 50  # reference: H=50, η=0.7, μ=0.5
    # lr: η = β, weight of the pair's pseudo-gradient; momentum: μ (the paper's α). name=noloco is the
    # paper's own form; any other outer optimizer steps on g = φ − θ̄ (γ = β only)
    outer_optimizer: OuterOptimizerConfig = field(default_factory=lambda: OuterOptimizerConfig("noloco", 0.7, 0.5))
    gamma: float | None = None  # weight of the pull towards the pair's mean φ; None: γ = β
    # None: the official NoLoCo partner sequence, default_rng(k·H + 1) at the k-th sync (H = inner_steps);
    # an int: decentrain's own seeded stream default_rng([seed, round]), not the reference one
    pairing_seed: int | None = 0
    odd_world: str = "error"  # error | idle | triple
    deadline_s: float | None = None  # None waits for the partner forever
    # enabled: the deadline follows observed arrival times (median + k·MAD), deadline_s is its cap
    adaptive_deadline: AdaptiveDeadlineConfig = field(default_factory=AdaptiveDeadlineConfig)
    # give up on a partner whose membership heartbeat has not moved for this long (it is stopped or
    # dead), before the deadline; None: only the deadline (and the progress keys) decide
    stall_s: float | None = 2.0
    heal_timeout_s: float = 300.0  # a replacement worker gives up (exits) if no live peer served its state by then
    bucket_mb: float = 32.0
    # enabled: the pair exchange carries top-k low-bit messages, error-fed (noloco/compressed_gossip.py)
    compression: NoLoCoCompressionConfig = field(default_factory=NoLoCoCompressionConfig)
    full_duplex: bool = True  # one process group per direction (start-up cost O(N²) groups)
    # one-step-delayed outer update: round r's pair exchange overlaps round r+1's inner steps (outer/overlap.py)
    overlap: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_overlap(self)
        check_range("algorithm.gamma", self.gamma, 0, 2, none_ok=True)  # null: gamma = outer_optimizer.lr
        if self.general and not OUTER_OPTIMIZERS.get(self.outer_optimizer.name).noloco_momentum:
            raise ValueError(
                f"algorithm.gamma={self.gamma} (!= algorithm.outer_optimizer.lr) needs NoLoCo's own momentum "
                f"form; allowed: algorithm.outer_optimizer.name=noloco, or gamma=null"
            )
        if self.odd_world not in ODD_POLICIES:
            raise ValueError(f"algorithm.odd_world={self.odd_world!r} is unknown; allowed: {list(ODD_POLICIES)}")
        check_range("algorithm.deadline_s", self.deadline_s, 0, 86400, low_open=True, none_ok=True)  # null: no deadline
        self.adaptive_deadline.check_cap(self.deadline_s)
        check_range("algorithm.stall_s", self.stall_s, 0, 86400, low_open=True, none_ok=True)
        check_range("algorithm.bucket_mb", self.bucket_mb, 0, 1 << 20, low_open=True)
        check_range("algorithm.heal_timeout_s", self.heal_timeout_s, 0, 86400, low_open=True)
        if self.compression.enabled and self.overlap:
            raise ValueError(
                "algorithm.compression.enabled=true with algorithm.overlap=true is not supported yet "
                "(the compressed step is synchronous); set one of them to false"
            )
        if self.compression.enabled and self.general:
            raise ValueError(f"algorithm.compression.enabled=true needs gamma=null (γ = β); got gamma={self.gamma}")
        if self.compression.enabled and self.compression.anchor_every and self.deadline_s is not None:
            raise ValueError(
                "algorithm.compression.anchor_every > 0 re-anchors with an all-gather that a late or dead "
                "partner would stall; with algorithm.deadline_s set use compression.anchor_every=0"
            )
        if self.pairing_seed is not None:
            check_range("algorithm.pairing_seed", self.pairing_seed, 0, 2**32 - 1)

    @property
    def effective_gamma(self) -> float:
        return self.outer_optimizer.lr if self.gamma is None else self.gamma

    @property
    def general(self) -> bool:
        """γ ≠ β: the paper's general form, which needs the pair's mean φ too."""
        return self.effective_gamma != self.outer_optimizer.lr


def group_mean(mine: list[torch.Tensor], partners: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """θ̄_G in fp32: this replica's tensors plus its partners', over the group size.

    Summed and kept in fp32 also for bf16 weights (the outer step is fp32): rounding θ̄ to
    bf16 first would cost up to η·½ ulp per round. Summed in group order (self first), as
    the reference code does.
    """
    out = []
    for i, t in enumerate(mine):
        total = t.float()  # may alias an fp32 caller tensor: add out of place
        for theirs in partners:
            total = total + theirs[i].to(t.device).float()
        out.append(total / (len(partners) + 1))
    return out


@ALGORITHMS.register("noloco", config=NoLoCoConfig)
class NoLoCo(InnerOuterAlgorithm):
    cfg: NoLoCoConfig
    survives_peer_loss = True  # a dead partner costs a round; the job is launched so that survivors go on
    healer: Healer | None = None
    trainer_state = load_trainer_state = None  # attached by the trainer
    _heal_metrics: dict[str, float] | None = None
    steps_skipped = 0  # inner steps of the rounds jumped over to catch up with the live ranks

    @classmethod
    def check_world(cls, cfg: NoLoCoConfig, world_size: int) -> None:
        if world_size > 1 and world_size % 2 and cfg.odd_world == "error":
            raise ValueError(
                f"world size {world_size} is odd and cannot be paired; set algorithm.odd_world to 'idle' "
                "(one rank sits out each round) or 'triple' (one group of three)"
            )

    def setup(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.outer = OuterOptimizer(self.params, self.cfg.outer_optimizer)
        self.phi = self.outer.slow  # fp32 slow weights, what a healing peer is served
        self.gossip = (
            CompressedGossip(self.cfg.compression, torch.cat([p.reshape(-1) for p in self.phi]))
            if self.cfg.compression.enabled
            else None
        )
        self.delayed = DelayedOuter(self.params) if self.cfg.overlap else None
        self.in_flight: tuple | None = None  # overlap: (round, group, payload sent, Future of the partners' tensors)
        self.background = Background("noloco-overlap") if self.cfg.overlap else None
        transport = self.transport
        # membership, pair groups and lanes where the transport keeps them: start-up, every rank
        transport.start_gossip(
            GossipOptions(
                int(self.cfg.bucket_mb * (1 << 20)),
                self.cfg.deadline_s,
                self.cfg.stall_s,
                self.cfg.full_duplex,
                self.cfg.adaptive_deadline,
            )
        )
        if (
            transport.pairs is not None and self.trainer_state is not None
        ):  # replacements heal from us, or we from a live peer
            self.healer = Healer(
                transport.membership,
                transport.pairs,
                self.trainer_state,
                self.load_trainer_state,
                attempt_s=max(60.0, 4 * (self.cfg.deadline_s or 0)),
            )
        if self.world.incarnation == 0:  # a replacement publishes once it has healed
            transport.publish(self.round - self._resumed_in_flight())  # rounds whose exchange has landed

    def _resumed_in_flight(self) -> int:
        """1 if the checkpoint being resumed has a round in flight (not landed, so not yet published)."""
        delayed = (self._resume or {}).get("outer", {}).get("delayed") or {}
        return int(delayed.get("in_flight_round") is not None)

    def _groups(self, round_idx: int) -> list[tuple[int, ...]]:
        return gossip_groups(
            round_idx,
            self.world.world_size,
            self.cfg.pairing_seed,
            self.cfg.odd_world,
            inner_steps=self.cfg.inner_steps,
        )

    def _catch_up(self) -> int:
        """Jump over rounds the live ranks are done with; returns the rounds jumped (0: not behind).

        A rank that was stopped or slow and is BEHIND+ rounds behind the median of the others would
        never pair again (everyone skips a rank that far behind), so it skips those rounds' inner
        steps and exchanges (one header each, so no partner waits on it) and rejoins one round past
        the live round. Not at it: the live ranks finish the round they are on while this rank runs
        its next inner steps, so a rank rejoining at `live` arrives after its partner left and is
        skipped as "already past" again, round after round, less than BEHIND rounds behind (seen in
        CI). One round ahead, it waits for its partner instead (bounded by the deadline). It keeps
        its own weights: the next mix pulls them towards its partner's.
        """
        live = self.transport.live_round()
        if live is None or live - self.round < BEHIND:
            return 0
        target = live + 1
        for r in range(self.round, target):
            self.transport.skip_round(group_of(self.world.rank, self._groups(r)), r)
        jumped = target - self.round
        behind = live - self.round
        log.warning("round %d: %d rounds behind the live ranks; jumping to round %d", self.round, behind, target)
        self.steps_skipped += (jumped - 1) * self.cfg.inner_steps  # this round's inner steps were run
        self.round = target - 1  # after_optimizer_step counts this outer step: the next round is `target`
        return jumped

    def heal(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.healer is None:
            raise RuntimeError(
                "a NoLoCo replacement heals over per-pair gloo groups and the trainer's state; "
                "neither is available here (NCCL without a deadline, or no trainer)"
            )
        # torch optimizers create their state on the first step: one zero-gradient step gives ours
        # the structure of the donor's, so that the donor's can be checked against it (then replaced)
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.outer.step([torch.zeros_like(s) for s in self.outer.slow])  # the outer optimizer's state too (momentum)
        donor, seconds = self.healer.heal(self.cfg.heal_timeout_s)
        log.info(
            "healed from rank %d in %.2fs: round %d, phi crc %08x",
            donor,
            seconds,
            self.round,
            tensors_crc(self._resume["outer"]["slow"]),
        )
        self._heal_metrics = {"heal/seconds": seconds, "heal/from_rank": float(donor)}
        self.transport.publish(self.round)  # back in the pairing, under the new incarnation

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        metrics = super().after_optimizer_step(step, model, optimizer)
        if self.healer is not None and self.inner_count == 0:  # just after an outer step: θ = φ, a clean snapshot
            self.healer.serve(self.phi)
        if self._heal_metrics:
            metrics, self._heal_metrics = {**metrics, **self._heal_metrics}, None
        return metrics

    def should_stop(self, step: int, total_steps: int) -> bool:
        return super().should_stop(step, total_steps) or (
            self.steps_skipped > 0 and step + self.steps_skipped >= total_steps
        )

    def on_train_end(self, model: torch.nn.Module) -> None:
        if self.in_flight is not None:  # stopped early (train.stop_at): let the exchange finish, unapplied
            self.in_flight[3].result()
            self.in_flight = None
        if self.background is not None:
            self.background.close()
        self.transport.finish(self.round)  # partners still running skip this rank at once
        if self.healer is not None:
            self.healer.finish()
        self.transport.close()

    def _payload(self, theta: list[torch.Tensor]) -> list[torch.Tensor]:
        """What the partner gets: θ, φ too when γ ≠ β, and the pace side data."""
        return theta + (self.phi if self.cfg.general else []) + [self.pace_tensor(self.params[0].device)]

    def pace_tensor(self, device: torch.device) -> torch.Tensor:
        """The pace side data a partner gets: (own step time, fastest step time heard)."""
        # side data lives with the weights (cat and NCCL need one device); inf (no timing yet) would
        # read as a non-finite message to the partner, so it travels as a large finite stand-in
        values = [min(v, 1e30) for v in (self.pace.step_time, min(self.pace.fastest, self.pace.step_time))]
        return torch.tensor(values, dtype=torch.float32, device=device)

    def _apply(
        self, sent: list[torch.Tensor], group: tuple[int, ...], partners: list | None, reset: bool
    ) -> dict[str, float]:
        """The outer step on φ from the group's payloads (None: the partner missed); θ ← φ when `reset`."""
        missed = partners is None
        if missed:  # partner late or gone: this round averages with nobody
            partners, group = [], (self.world.rank,)
        mean = group_mean(sent, partners)
        n = len(self.params)
        theta_bar = mean[:n]
        if self.cfg.general:
            phi_bar = mean[n : 2 * n]
            mean_pg = [pb - tb.float() for pb, tb in zip(phi_bar, theta_bar)]  # mean Δ = mean φ − θ̄
            opt = self.cfg.outer_optimizer
            noloco_general_step_(
                self.phi,
                self.params if reset else None,
                self.outer.opt.buffers(),
                mean_pg,
                phi_bar,
                alpha=opt.momentum,
                beta=opt.lr,
                gamma=self.cfg.effective_gamma,
            )
        else:  # g = φ − θ̄_G; with outer_optimizer.name=noloco: m ← μ·m − η·g ; φ ← φ + m ; θ ← φ
            self.outer.step(self.outer.pseudo_gradient(theta_bar))
            if reset:
                self.outer.copy_to(self.params)
        if self.cfg.adaptive_inner_steps and len(group) > 1:
            # others' values from the group mean: sum_others = k·mean − mine
            others = (mean[-1] * len(group) - sent[-1]) / (len(group) - 1)
            if float(others[1]) < 1e30:
                self.pace.hear(float(others[1]))
        st = self.transport.stats
        return {
            "outer/partner_missed": float(missed),
            "outer/exchange_timeouts": float(st.timeouts),
            "outer/exchange_dropped": float(st.dropped),
            "outer/partner_skipped": float(st.partner_skipped),
            **(
                {}
                if st.deadline_s is None
                else {"outer/deadline_s": st.deadline_s, "outer/exchange_early_timeouts": float(st.early_timeouts)}
            ),
        }

    def outer_step(self, model: torch.nn.Module) -> dict[str, float]:
        if self.delayed is not None:
            return self._overlapped_outer_step()
        jumped = self._catch_up()
        group = group_of(self.world.rank, self._groups(self.round))
        if self.gossip is not None:
            return compressed_outer_step(self, group, jumped)
        sent = self._payload([p.detach() for p in self.params])
        partners = None if jumped else self.transport.exchange(sent, group, self.round)
        metrics = self._apply(sent, group, partners, reset=True)
        self.transport.publish(self.round + 1)
        return {"outer/round": float(self.round + 1), **metrics, "outer/rounds_jumped": float(jumped)}

    # -- overlap: round r's exchange runs during round r+1 --------------------------------
    def _overlapped_outer_step(self) -> dict[str, float]:
        metrics = self._land()  # round r−1, one round late
        self.transport.publish(self.round)  # rounds landed: a partner's round-r exchange must still wait for us
        jumped = self._catch_up()
        self.delayed.correct(self.params, self.phi)  # θ ← φ + (θ − b) ; b ← θ
        self._send(self.round, jumped=bool(jumped))
        return {"outer/round": float(self.round + 1), **metrics, "outer/rounds_jumped": float(jumped)}

    def _send(self, round_idx: int, jumped: bool = False) -> None:
        """Start round `round_idx`'s exchange of b (θ just after the correction) on the helper thread."""
        group = group_of(self.world.rank, self._groups(round_idx))
        sent = self._payload(self.delayed.base)
        if jumped:  # no exchange this round: it lands as a missed one (own weights only), as without overlap
            missed: Future = Future()
            missed.set_result(None)
            self.in_flight = (round_idx, group, sent, missed)
        else:
            self.in_flight = (
                round_idx,
                group,
                sent,
                self.background.submit(self.transport.exchange, sent, group, round_idx),
            )

    def _land(self) -> dict[str, float]:
        if self.in_flight is None:
            return {}
        _, group, sent, partners = self.in_flight
        self.in_flight = None
        return self._apply(sent, group, partners.result(), reset=False)

    def drain(self, model: torch.nn.Module) -> dict[str, float]:
        if self.delayed is None or self.in_flight is None:
            return {}
        metrics = self._land()
        self.delayed.correct(self.params, self.phi)
        self.transport.publish(self.round)
        return metrics

    def outer_state(self) -> dict[str, Any]:
        state = {**self.outer.state_dict(), "pairing_seed": self.cfg.pairing_seed, "steps_skipped": self.steps_skipped}
        if self.gossip is not None:
            state["compression"] = self.gossip.state_dict()
        if self.delayed is not None:  # the payload in flight is rebuilt from b and φ: nothing waits for it
            state["delayed"] = {
                **self.delayed.state_dict(),
                "in_flight_round": None if self.in_flight is None else self.in_flight[0],
            }
        return state

    @torch.no_grad()
    def load_outer_state(self, state: dict[str, Any]) -> None:
        if state.get("pairing_seed") != self.cfg.pairing_seed:
            raise ValueError(
                f"algorithm.pairing_seed={self.cfg.pairing_seed} differs from the checkpoint's "
                f"{state.get('pairing_seed')}: resumed replicas would pick other partners"
            )
        self.steps_skipped = int(state.get("steps_skipped", 0))
        delayed = state.get("delayed") or {}
        if delayed.get("in_flight_round") is not None and self.delayed is None:
            raise ValueError(
                "the checkpoint has an overlapped outer step in flight; resume with algorithm.overlap=true"
            )
        self.outer.load_state_dict(state)
        if self.gossip is not None:
            if "compression" not in state:
                raise ValueError(
                    "algorithm.compression.enabled=true but the checkpoint has no compression state "
                    "(error buffer, anchor): resuming without it would not be exact"
                )
            self.gossip.load_state_dict(state["compression"])
        if self.delayed is not None and delayed:
            self.delayed.load_state_dict(delayed)
            # every replica resumes at the same step and sends its round again; a replacement that healed
            # from a peer does not: that round was the donor's, exchanged with the donor's partner
            if delayed["in_flight_round"] is not None and self.world.incarnation == 0:
                self._send(int(delayed["in_flight_round"]))
