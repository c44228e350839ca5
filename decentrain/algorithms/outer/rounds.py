"""How an outer round of DiLoCo or SparseLoCo closes, picked by `algorithm.rounds.mode` (a registry).

The family computes its payload (DiLoCo: Δ = φ − θ; SparseLoCo: the error-fed sparse message) and
hands it to its round strategy with the inner steps it covers; the strategy returns the merged
update of every round to apply now, in order, and the family takes one outer step per update. A
`RoundCodec` (one per family) says how its payload travels: `collective` is the family's lock-step
operation, `merge` the same mean from payloads read off the board, `left_out` what to do with a
payload left out for good.

  lockstep  the collective, every replica every round: today's DiLoCo and SparseLoCo, unchanged.
  quorum    rounds on a board (outer/quorum_board.py) that close by outer/quorum.py's rules. A round
            every replica delivered on time, with equal tokens and nothing stale, runs the lock-step
            collective itself (so that case is bit-identical to `lockstep`); any other round merges
            its members' payloads from the board, in the record's order. A replica that finds its
            round closed without it applies every closed round's update in turn (the same payloads,
            order and outer steps as everyone: identical slow weights) and hands its late payload to
            `algorithm.rounds.late`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from decentrain.algorithms.outer.quorum import (
    FIELD,
    LATE_RULES,
    Delivery,
    RoundRecord,
    RoundsConfig,
    close,
    due,
    token_scales,
)
from decentrain.algorithms.outer.quorum_board import Outage, board_for
from decentrain.core.comm.transport import Transport
from decentrain.core.registry import Registry

log = logging.getLogger(__name__)

P = TypeVar("P")  # a family's payload
M = TypeVar("M")  # its merged update


class RoundCodec(Protocol[P, M]):
    def to_bytes(self, payload: P) -> bytes: ...

    def collective(self, payload: P) -> tuple[M, dict[str, float]]:
        """The lock-step operation: every replica calls it, with its own payload."""
        ...

    def merge(self, parts: list[tuple[bytes, float, int]]) -> tuple[M, dict[str, float]]:
        """The mean of (payload bytes, scale, base round) in this order; a part that does not decode is dropped
        and counted (the mean is over the rest)."""
        ...

    def left_out(self, payload: P) -> None:
        """This replica's payload was left out of every merge for good."""
        ...


@dataclass
class Synced(Generic[M]):
    updates: list  # merged updates, one per round to apply, in order
    metrics: dict[str, float] = field(default_factory=dict)


class RoundStrategy:
    """One registry entry: built once per replica in the family's setup."""

    supports_overlap = True  # algorithm.overlap=true (the one-step-delayed collective)
    supports_pacing = True  # algorithm.adaptive_inner_steps=true (a MIN all-reduce each round)
    needs_board = False  # True: rounds meet on a board of the transport's (not torchft's Manager)

    def __init__(self, cfg: RoundsConfig, rank: int, world_size: int, transport: Transport, codec: RoundCodec):
        self.cfg, self.rank, self.n, self.transport, self.codec = cfg, rank, world_size, transport, codec

    @classmethod
    def check_family(cls, mode: str, overlap: bool, pacing: bool) -> None:
        if overlap and not cls.supports_overlap:
            raise ValueError(
                f"{FIELD}.mode={mode} with algorithm.overlap=true is not supported; allowed: overlap=false"
            )
        if pacing and not cls.supports_pacing:
            raise ValueError(
                f"{FIELD}.mode={mode} with algorithm.adaptive_inner_steps=true is not supported "
                "(token weighting already credits a replica that ran fewer steps); allowed: false"
            )

    def start(self) -> None:
        pass

    def exchange(self, payload: Any, steps: int, round_idx: int) -> Synced:
        raise NotImplementedError

    def stops(self, rounds_done: int, total_steps: int, inner_steps: int) -> bool:
        """End the run before total_steps (a replica that skipped rounds reaches the last one sooner)."""
        return False

    def drain(self, rounds_done: int) -> Synced:
        """At the last step: the updates of the run's rounds this replica has not applied yet."""
        return Synced([])

    def finish(self) -> None:
        pass


ROUND_MODES: Registry[type[RoundStrategy]] = Registry(f"{FIELD}.mode")


def check_rounds(cfg: RoundsConfig, overlap: bool = False, pacing: bool = False) -> None:
    """The family's config check: the mode exists and supports the family's other choices."""
    ROUND_MODES.get(cfg.mode, field=f"{FIELD}.mode").check_family(cfg.mode, overlap, pacing)


@ROUND_MODES.register("lockstep")
class Lockstep(RoundStrategy):
    def exchange(self, payload: Any, steps: int, round_idx: int) -> Synced:
        update, metrics = self.codec.collective(payload)
        return Synced([update], metrics)


@ROUND_MODES.register("quorum")
class Quorum(RoundStrategy):
    supports_overlap = False  # the delayed collective would wait for every replica again
    supports_pacing = False
    needs_board = True

    def __init__(self, cfg: RoundsConfig, rank: int, world_size: int, transport: Transport, codec: RoundCodec):
        super().__init__(cfg, rank, world_size, transport, codec)
        self.board = board_for(transport, world_size, cfg.poll_s, cfg.grace.window)
        self.clock = self.board.clock
        self.late = LATE_RULES.get(cfg.late)
        self.quorum = cfg.quorum(world_size)
        self.opened = 0.0  # when this replica began its current round (its clock)
        self.arrivals: list[float] = []  # the arrival window of the last record applied
        self.stale: tuple[int, int, Any] | None = None  # (round posted to, base, payload) of a late payload in flight
        self.deferred: tuple[int, Any] | None = None  # (round, payload) delivered without its bytes (see _exchange)
        self.counts = {"late_rounds": 0, "dropped_steps": 0, "stale_merged": 0, "lost_steps": 0, "outages": 0}
        self.target: int | None = None

    def start(self) -> None:
        self.clock.enter(self.rank)
        self.opened = self.clock.now(self.rank)

    def finish(self) -> None:
        self.board.leave(self.rank)
        self.clock.exit(self.rank)

    def stops(self, rounds_done: int, total_steps: int, inner_steps: int) -> bool:
        self.target = math.ceil(total_steps / inner_steps)  # the run's rounds (drain needs them)
        return rounds_done >= self.target

    def drain(self, rounds_done: int) -> Synced:
        """Out of steps (work lost to an outage or a late round) before the run's last round: leave, so that
        no round waits for us, and apply the remaining rounds as they close, while any replica still trains."""
        self.board.leave(self.rank)
        updates, metrics = self._follow(rounds_done, rounds_done if self.target is None else self.target)
        return Synced(updates, metrics)

    def exchange(self, payload: Any, steps: int, round_idx: int) -> Synced:
        try:
            return self._exchange(payload, steps, round_idx)
        except BaseException as e:  # a simulation's other replicas must not wait for this one forever
            abort = getattr(self.clock, "abort", None)
            if abort is not None:
                abort(e)
            raise

    # -- one round -----------------------------------------------------------------------------
    def _exchange(self, payload: Any, steps: int, r: int) -> Synced:
        outage = self.clock.spend(self.rank, steps)
        if outage is not None:
            return self._recover(outage, steps, r)
        now = self.clock.now(self.rank)
        # where the round may run as the collective, its payload waits for the record: an on-time round puts
        # nothing on the store; in a simulation (one replica runs at a time) a reader could not wait for it
        eager = not self.clock.collectives_ok
        self.board.post(
            r, Delivery(self.rank, r, steps, now - self.opened, now), self._upload(payload) if eager else None
        )
        self.deferred = None if eager else (r, payload)
        rec = self._await(r)
        if any(m.rank == self.rank and m.base == r for m in rec.members):
            update, metrics = self._apply(rec, own=payload)
            updates = [update]
        else:  # closed without us: catch up on every closed round, the late payload goes by the rule, rejoin
            self.counts["late_rounds"] += 1
            updates, metrics = self._catch_up(r)
            log.info(
                "quorum round %d closed without this replica (%s); applying %d closed rounds, rejoining at the next",
                r,
                self.cfg.late,
                len(updates),
            )
            self._late(payload, steps, r, now - self.opened, len(updates))
            self.board.leave(self.rank)
            more, metrics = self._rejoin(r + len(updates), metrics)
            updates += more
        self.opened = self.clock.now(self.rank)
        return Synced(updates, {**metrics, **self._metrics(rec)})

    def _await(self, r: int) -> RoundRecord:
        """Round r's record, closing the round when it is due by this replica's view and clock."""
        deadline_s = self.cfg.grace.deadline(self.arrivals)
        while True:
            rec = self.board.record(r)
            if rec is not None:
                return rec
            deliveries = self.board.deliveries(r)
            now = self.clock.now(self.rank)
            wake = None
            if deliveries is not None:  # None: one is being written; look again
                live = self.board.live()
                fresh = {d.rank for d in deliveries if d.base == r}
                ready, wake = due(fresh, live, self.quorum, now, self.opened + deadline_s)
                if ready:
                    rec = close(
                        r,
                        deliveries,
                        live,
                        self.n,
                        deadline_s,
                        self.arrivals,
                        self.cfg.grace.window,
                        self.late,
                        self.cfg.staleness_exponent,
                        now,
                    )
                    return self.board.publish(rec, self.cfg.retain_rounds)
            self.clock.wait(self.rank, wake)

    def _apply(self, rec: RoundRecord, own: Any = None) -> tuple[Any, dict[str, float]]:
        """Round rec.round's merged update: the collective when the round is the lock-step one, else the
        members' payloads from the board (ours from memory when `own` is this round's fresh payload)."""
        self.arrivals = rec.arrivals
        self._settle_stale(rec)
        if rec.full and own is not None and self.clock.collectives_ok:
            self.deferred = None
            return self.codec.collective(own)
        self._put_deferred(rec)
        scales = token_scales([m.weight for m in rec.members])
        parts = []
        for m, s in zip(rec.members, scales):
            mine = own is not None and m.rank == self.rank and m.base == rec.round
            data = self.codec.to_bytes(own) if mine else self.board.payload(rec.round, m.rank, m.base)
            parts.append((data, s, m.base))
        return self.codec.merge(parts)

    def _upload(self, payload: Any) -> bytes:
        data = self.codec.to_bytes(payload)
        self.transport.stats.bytes_sent += len(data)  # the store's traffic is this replica's too
        return data

    def _put_deferred(self, rec: RoundRecord) -> None:
        """Our deferred payload of round rec.round, put now if the record merges it off the board."""
        if self.deferred is None or self.deferred[0] != rec.round:
            return
        _, payload = self.deferred
        self.deferred = None
        if any(m.rank == self.rank and m.base == rec.round for m in rec.members):
            self.board.put_payload(rec.round, self.rank, rec.round, self._upload(payload))

    def _rejoin(self, r: int, metrics: dict[str, float]) -> tuple[list[Any], dict[str, float]]:
        """Sit out open round r (this replica has left it) and join at its close, in phase with the others: a
        replica that started its next round now, mid-round, would deliver late again by the same offset (a
        drop-rule replica would stay out for good). Idle at most one round; not past the run's last round."""
        updates: list[Any] = []
        if self.target is None or r < self.target:
            updates, metrics = self._follow(r, r + 1, metrics)
        self.board.join(self.rank)
        return updates, metrics

    def _follow(self, r: int, end: int, metrics: dict[str, float] | None = None) -> tuple[list[Any], dict[str, float]]:
        """Apply rounds r..end-1 as they close, this replica out of their quorum, while any other replica is live."""
        updates, metrics = [], metrics or {}
        while r < end:
            rec = self.board.record(r)
            if rec is not None:
                update, metrics = self._apply(rec)
                updates.append(update)
                r += 1
            elif not self.board.live() - {self.rank}:
                log.warning("quorum: round %d never closed (every other replica is done); ending on round %d", r, r)
                break
            else:
                self.clock.wait(self.rank, None)
        return updates, metrics

    def _catch_up(self, r: int) -> tuple[list[Any], dict[str, float]]:
        """The updates of rounds r, r+1, ... that are closed (r is), applied in order as everyone did."""
        updates, metrics = [], {}
        while (rec := self.board.record(r)) is not None:
            update, metrics = self._apply(rec)
            updates.append(update)
            r += 1
        return updates, metrics

    def _late(self, payload: Any, steps: int, base: int, seconds: float, caught_up: int) -> None:
        open_round = base + caught_up
        if self.late(open_round - base, self.cfg.staleness_exponent) is None:
            self.counts["dropped_steps"] += steps
            self.codec.left_out(payload)
            return
        now = self.clock.now(self.rank)
        self.board.post(open_round, Delivery(self.rank, base, steps, seconds, now), self._upload(payload))
        self.stale = (open_round, base, payload)

    def _settle_stale(self, rec: RoundRecord) -> None:
        """A late payload posted to this round is merged now, or (it came after the close) dropped."""
        if self.stale is None or self.stale[0] != rec.round:
            return
        _, base, payload = self.stale
        self.stale = None
        if any(m.rank == self.rank and m.base == base for m in rec.members):
            self.counts["stale_merged"] += 1
        else:
            self.codec.left_out(payload)

    def _recover(self, outage: Outage, steps: int, r: int) -> Synced:
        """A scripted outage (SimClock): this round's work is lost; the others notice, it comes back,
        catches up on the rounds closed meanwhile and rejoins at the next round boundary."""
        self.counts["outages"] += 1
        self.counts["lost_steps"] += steps
        log.info(
            "quorum round %d: down from %.1f to %.1f (scripted); its %d steps are lost",
            r,
            outage.start,
            outage.end,
            steps,
        )
        self.clock.sleep_until(self.rank, outage.noticed)
        self.board.leave(self.rank)
        self.clock.sleep_until(self.rank, outage.end)
        updates, metrics = self._catch_up(r)
        if self.stale is not None and self.board.record(self.stale[0]) is None:
            self.stale = None  # the process that posted it is gone; the board may still merge it
        more, metrics = self._rejoin(r + len(updates), metrics)
        updates += more
        self.opened = self.clock.now(self.rank)
        return Synced(updates, {**metrics, "quorum/outage": 1.0})

    def _metrics(self, rec: RoundRecord) -> dict[str, float]:
        fresh = rec.fresh
        return {
            "quorum/members": float(len(fresh)),
            "quorum/stale_members": float(len(rec.members) - len(fresh)),
            "quorum/full": float(rec.full),
            "quorum/deadline_s": rec.deadline_s if rec.deadline_s is not None else -1.0,
            "quorum/board_dropped": float(self.board.dropped),
            **{f"quorum/{k}": float(v) for k, v in self.counts.items()},
        }


def build_rounds(
    cfg: RoundsConfig, rank: int, world_size: int, transport: Transport, codec: RoundCodec
) -> RoundStrategy:
    return ROUND_MODES.get(cfg.mode, field=f"{FIELD}.mode")(cfg, rank, world_size, transport, codec)
