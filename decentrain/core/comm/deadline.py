"""Adaptive gossip deadlines: a partner's deadline follows the arrival times this rank observed.

A fixed `deadline_s` must be set for the worst link and the slowest partner, so a partner
that died costs every affected pair that full worst case. Here the deadline is a robust
upper quantile of recent arrival times, with the fixed value as the cap:

    a_1 … a_w   the last w arrival times (seconds from this rank's exchange start until a
                partner's whole message was received and checked), pooled over partners
    m    = median(a)
    MAD  = median(|a_i − m|)
    d    = min(cap, m + max(k·MAD, margin))       (d = cap until `warmup` arrivals were seen)

Pooled per job, not per partner: random pairings meet a given partner about once every
N−1 rounds, too rarely for a per-partner window; every partner runs the same steps on the
same kind of link, so one window describes them all. A miss is recorded as an arrival at
the deadline it missed (a censored sample): a run of misses raises the median and so the
deadline, up to the cap, instead of freezing a too-short deadline that keeps dropping
partners. `margin` keeps a window of near-identical arrivals (MAD ≈ 0) from producing a
deadline with no room for jitter. The deadline is only ever a reason to stop waiting: a partner
that arrives after it costs that round's average, exactly as with a fixed deadline.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from decentrain.core.config_checks import check_range


def adaptive_deadline(arrivals: list[float], k: float, margin: float, cap: float) -> float:
    """min(cap, median + max(k·MAD, margin)) of `arrivals` (the cap when there are none)."""
    if not arrivals:
        return cap
    m = statistics.median(arrivals)
    mad = statistics.median(abs(a - m) for a in arrivals)
    return min(cap, m + max(k * mad, margin))


@dataclass
class AdaptiveDeadlineConfig:
    """`algorithm.adaptive_deadline`: off by default; the fixed `deadline_s` is the cap when on."""

    enabled: bool = False
    k: float = 6.0  # MADs above the median (MAD ≈ 0.67σ for normal jitter, so 6 MAD ≈ 4σ)
    window: int = 32  # arrivals remembered, over all partners
    warmup: int = 4  # arrivals seen before the deadline leaves the cap
    margin_s: float = 0.5  # at least this much headroom above the median

    def __post_init__(self) -> None:
        for f in ("window", "warmup"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"algorithm.adaptive_deadline.{f}={v!r} must be an integer")
        check_range("algorithm.adaptive_deadline.k", self.k, 0, 100)
        check_range("algorithm.adaptive_deadline.window", self.window, 1, 1 << 16)
        check_range("algorithm.adaptive_deadline.warmup", self.warmup, 1, self.window)
        check_range("algorithm.adaptive_deadline.margin_s", self.margin_s, 0, 86400, low_open=True)

    def check_cap(self, deadline_s: float | None) -> None:
        """An adaptive deadline needs the fixed one as its cap."""
        if not self.enabled:
            return
        if deadline_s is None:
            raise ValueError(
                "algorithm.adaptive_deadline.enabled=true needs algorithm.deadline_s (the cap); "
                "allowed: a number > 0, or adaptive_deadline.enabled=false"
            )


@dataclass
class ArrivalWindow:
    """The last `window` arrival times of one rank, and the deadline they give."""

    cap: float
    cfg: AdaptiveDeadlineConfig = field(default_factory=AdaptiveDeadlineConfig)
    arrivals: deque = field(default_factory=deque)

    def deadline(self) -> float:
        if len(self.arrivals) < self.cfg.warmup:
            return self.cap
        return adaptive_deadline(list(self.arrivals), self.cfg.k, self.cfg.margin_s, self.cap)

    def _push(self, seconds: float) -> None:
        self.arrivals.append(float(seconds))
        while len(self.arrivals) > self.cfg.window:
            self.arrivals.popleft()

    def arrived(self, seconds: float) -> None:
        self._push(seconds)

    def missed(self, deadline: float) -> None:
        """A partner missed `deadline`: record the censored arrival (it came later, if at all)."""
        self._push(deadline)
