"""Quorum rounds: the pure rules of an outer round that never waits for the slowest replica.

A round r of DiLoCo or SparseLoCo in `algorithm.rounds.mode=quorum` (outer/rounds.py runs it) closes

    at once when every live replica has delivered its pseudo-gradient, or
    when at least q = min(min_quorum, live) replicas have delivered and the deadline D has passed,

where D, counted from the moment the waiting replica opened the round, is the existing adaptive
deadline policy (core/comm/deadline.py: median + max(k·MAD, margin) of recent delivery times, capped,
a miss recorded as a censored arrival at the deadline it missed). The grace window after the quorum
is max(0, D − t_q). The round's record lists its members; every replica merges exactly those
payloads, in that order, and takes the outer step on the result: identical slow weights everywhere.

Merging is token-weighted. Member i with weight w_i (its tokens: inner steps × the job's tokens per
step, which the trainer makes equal across replicas, so steps stand for tokens) enters as s_i·Δ_i with
s_i = m·w_i / Σw over the m members, and the family's mean divides by m: Σ w_i Δ_i / Σ w_i. With equal
weights s_i is exactly 1 and the mean is the plain mean bit for bit (`token_scales`).

A replica that delivers after its round closed ("late") applies the closed rounds' merged updates when
it next syncs (outer/rounds.py); its late pseudo-gradient goes by `algorithm.rounds.late`:

  drop      discarded, as torchft discards the step of a replica group that missed the quorum (it heals
            to the committed state); SparseLoCo's error feedback takes the dropped values back.
  fedasync  merged into the next round that closes after it arrives, its weight discounted by the
            polynomial staleness function of FedAsync (Xie, Koyejo and Gupta 2019, arXiv 1903.03934):
            w = tokens·(1 + s)^(−a), s the rounds it is late by, a = `staleness_exponent` (0.5 there).
            It does not count towards the quorum. "Asynchronous Local-SGD" (Liu et al. 2024, arXiv
            2401.09135) studies such stale merges for language models.

Everything here is plain data and functions: records are JSON written by one replica and read by the
others, so their decoder is total (returns None on anything malformed, with caps checked first).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from decentrain.core.comm.deadline import AdaptiveDeadlineConfig, ArrivalWindow
from decentrain.core.config_checks import check_range
from decentrain.core.registry import Registry
from decentrain.core.typed import typed

FIELD = "algorithm.rounds"
MAX_RECORD_BYTES = 1 << 20  # a record holds a few numbers per replica; anything larger is refused unread


# -- late pseudo-gradients ----------------------------------------------------------------
LateRule = Callable[[int, float], "float | None"]  # (staleness in rounds, exponent) -> weight factor, None: drop
LATE_RULES: Registry[LateRule] = Registry(f"{FIELD}.late")


@LATE_RULES.register("drop")
def _drop(staleness: int, exponent: float) -> float | None:
    return None


@LATE_RULES.register("fedasync")
def _fedasync(staleness: int, exponent: float) -> float | None:
    return (1.0 + staleness) ** -exponent  # FedAsync's polynomial s(t − τ) = (t − τ + 1)^(−a)


# -- config ---------------------------------------------------------------------------------
@dataclass
class GraceConfig(AdaptiveDeadlineConfig):
    """`algorithm.rounds.grace`: how long after it opened a round waits for replicas beyond the quorum."""

    enabled: bool = True  # the adaptive deadline (median + k·MAD of recent deliveries); false: always cap_s
    cap_s: float | None = 600.0  # the longest wait; null: no deadline, every live replica is waited for

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
            check_range(f"{FIELD}.grace.cap_s", self.cap_s, 0, 86400 * 7, low_open=True, none_ok=True)
        except ValueError as e:  # the inherited checks name the gossip section; this one is ours
            raise ValueError(str(e).replace("algorithm.adaptive_deadline.", f"{FIELD}.grace.")) from None

    def deadline(self, arrivals: list[float]) -> float:
        """D for the next round from the arrival window the last record carries (inf: no deadline)."""
        w = ArrivalWindow(math.inf if self.cap_s is None else self.cap_s, self)
        if not self.enabled:
            return w.cap
        w.arrivals.extend(arrivals[-self.window :])
        return w.deadline()


@dataclass
class RoundsConfig:
    """`algorithm.rounds`: how an outer round of DiLoCo / SparseLoCo closes (outer/rounds.py's ROUND_MODES)."""

    mode: str = "lockstep"  # lockstep: every replica, every round (a collective); quorum: see outer/quorum.py
    min_quorum: int | None = None  # quorum: deliveries a round needs before its deadline may close it; null: N − 1
    grace: GraceConfig = field(default_factory=GraceConfig)
    late: str = "drop"  # what happens to a pseudo-gradient that missed its round: drop | fedasync
    staleness_exponent: float = 0.5  # fedasync's a in (1 + s)^(−a)
    retain_rounds: int = 16  # closed rounds whose payloads stay on the board, for replicas catching up
    poll_s: float = 0.05  # across processes: how often a waiting replica re-reads the board

    def __post_init__(self) -> None:
        if isinstance(self.grace, Mapping):  # built by hand from plain values (configs come typed already)
            self.grace = typed(GraceConfig, self.grace, f"{FIELD}.grace")
        if self.min_quorum is not None:
            if not isinstance(self.min_quorum, int) or isinstance(self.min_quorum, bool):
                raise ValueError(f"{FIELD}.min_quorum={self.min_quorum!r} must be an integer or null")
            check_range(f"{FIELD}.min_quorum", self.min_quorum, 1, 1 << 20)
        LATE_RULES.get(self.late, field=f"{FIELD}.late")
        check_range(f"{FIELD}.staleness_exponent", self.staleness_exponent, 0, 10)
        if not isinstance(self.retain_rounds, int) or isinstance(self.retain_rounds, bool):
            raise ValueError(f"{FIELD}.retain_rounds={self.retain_rounds!r} must be an integer")
        check_range(f"{FIELD}.retain_rounds", self.retain_rounds, 1, 1 << 16)
        check_range(f"{FIELD}.poll_s", self.poll_s, 0, 60, low_open=True)

    def quorum(self, world_size: int) -> int:
        return max(1, world_size - 1) if self.min_quorum is None else self.min_quorum

    def check_world(self, world_size: int) -> None:
        if self.min_quorum is not None and self.min_quorum > world_size:
            raise ValueError(f"{FIELD}.min_quorum={self.min_quorum} exceeds the {world_size} replicas")


def rounds_config(value: "RoundsConfig | Mapping[str, Any]") -> RoundsConfig:
    """The section from a dataclass or plain values (`DiLoCoConfig(rounds={"mode": "quorum"})`)."""
    return value if isinstance(value, RoundsConfig) else typed(RoundsConfig, value, FIELD)


# -- what travels on the board ---------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    """One pseudo-gradient posted to round `round`: fresh when base == round, stale when base < round."""

    rank: int
    base: int  # the round whose slow weights it starts from
    steps: int  # inner steps it covers (the weight: tokens)
    seconds: float  # since the replica opened its round (the deadline policy's arrival time)
    time: float  # on the board's clock when posted

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()


@dataclass(frozen=True)
class Member:
    rank: int
    base: int
    weight: float


@dataclass
class RoundRecord:
    """A closed round: who is merged, in which order, and what the next deadline learns from it."""

    round: int
    members: list[Member]  # merge order: fresh in rank order, then stale by (base, rank)
    full: bool  # every replica fresh, equal weights, nothing stale: the lock-step round itself
    deadline_s: float | None  # D this round ran under (None: no deadline)
    arrivals: list[float]  # the arrival window after this round (feeds the next D)
    closed_at: float
    missed: list[int]  # replicas live at the close that had not delivered

    def encode(self) -> bytes:
        out = asdict(self)
        out["members"] = [[m.rank, m.base, m.weight] for m in self.members]
        return json.dumps(out, allow_nan=False).encode()

    @property
    def fresh(self) -> list[Member]:
        return [m for m in self.members if m.base == self.round]


def _int(x: Any, lo: int, hi: int) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi else None


def _num(x: Any, lo: float = 0.0) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= lo
    return float(x) if ok else None


def _json(raw: Any) -> Any:
    if not isinstance(raw, (bytes, bytearray)) or len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        return json.loads(raw)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


def decode_delivery(raw: Any, world_size: int, round_idx: int) -> Delivery | None:
    """A delivery posted for `round_idx`, or None if it is not one (malformed, out of range)."""
    d = _json(raw)
    if not isinstance(d, dict) or set(d) != {"rank", "base", "steps", "seconds", "time"}:
        return None
    rank, base, steps = _int(d["rank"], 0, world_size - 1), _int(d["base"], 0, round_idx), _int(d["steps"], 1, 1 << 40)
    seconds, time = _num(d["seconds"]), _num(d["time"], -math.inf)
    if None in (rank, base, steps, seconds, time):
        return None
    return Delivery(rank, base, steps, seconds, time)


def decode_record(raw: Any, world_size: int, round_idx: int, window: int) -> RoundRecord | None:
    """The record of `round_idx`, or None if it is not one."""
    d = _json(raw)
    keys = {"round", "members", "full", "deadline_s", "arrivals", "closed_at", "missed"}
    if not isinstance(d, dict) or set(d) != keys or d["round"] != round_idx or not isinstance(d["full"], bool):
        return None
    if not all(isinstance(d[k], list) for k in ("members", "arrivals", "missed")) or len(d["members"]) > 4 * world_size:
        return None
    members = []
    for m in d["members"]:
        if not isinstance(m, list) or len(m) != 3:
            return None
        rank, base, weight = _int(m[0], 0, world_size - 1), _int(m[1], 0, round_idx), _num(m[2])
        if None in (rank, base, weight):
            return None
        members.append(Member(rank, base, weight))
    arrivals = [_num(a) for a in d["arrivals"][:window]]
    missed = [_int(r, 0, world_size - 1) for r in d["missed"][:world_size]]
    deadline, closed_at = d["deadline_s"], _num(d["closed_at"], -math.inf)
    if None in arrivals or None in missed or closed_at is None or (deadline is not None and _num(deadline) is None):
        return None
    return RoundRecord(round_idx, members, d["full"], deadline, arrivals, closed_at, missed)


# -- the rules ---------------------------------------------------------------------------------
def token_scales(weights: list[float]) -> list[float]:
    """s_i = m·w_i / Σw, so that (Σ s_i·Δ_i) / m is the weighted mean. Equal weights give exactly 1.0
    each (not m·w/(m·w) rounded), so the merge is the plain mean bit for bit."""
    m = len(weights)
    if m == 0 or all(w == weights[0] for w in weights):
        return [1.0] * m
    total = math.fsum(weights)
    return [m * w / total for w in weights]


def due(delivered: set[int], live: set[int], quorum: int, now: float, deadline_at: float) -> tuple[bool, float | None]:
    """(close now?, else the time to look again: the deadline once the quorum is met, None: on a change)."""
    if live <= delivered and delivered:
        return True, None
    q = max(1, min(quorum, len(live | delivered)))  # fewer live than min_quorum: every live replica is the quorum
    if len(delivered) >= q:
        return (True, None) if now >= deadline_at else (False, deadline_at)
    return False, None


def close(
    round_idx: int,
    deliveries: list[Delivery],
    live: set[int],
    world_size: int,
    deadline_s: float,
    previous: list[float],
    window: int,
    late: LateRule,
    exponent: float,
    now: float,
) -> RoundRecord:
    """The record of a round closing now with `deliveries` (already read in posting order)."""
    fresh: dict[int, Delivery] = {}
    stale: dict[tuple[int, int], Delivery] = {}
    for d in deliveries:
        if d.base == round_idx:
            fresh.setdefault(d.rank, d)
        else:
            stale.setdefault((d.base, d.rank), d)
    members = [Member(r, round_idx, float(fresh[r].steps)) for r in sorted(fresh)]
    for (base, rank), d in sorted(stale.items()):
        factor = late(round_idx - base, exponent)
        if factor is not None and factor > 0:
            members.append(Member(rank, base, float(d.steps) * factor))
    weights = [m.weight for m in members]
    full = len(fresh) == world_size and len(members) == world_size and all(w == weights[0] for w in weights)
    missed = sorted(live - set(fresh))
    arrivals = list(previous) + [fresh[r].seconds for r in sorted(fresh)]
    if math.isfinite(deadline_s):
        arrivals += [deadline_s] * len(missed)  # censored: they came later, if at all
    return RoundRecord(
        round_idx, members, full, deadline_s if math.isfinite(deadline_s) else None, arrivals[-window:], now, missed
    )
