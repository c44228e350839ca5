"""What peers may cost this node per round: rebuild + scoring time, per sender and in total.

A peer's groups make this node rebuild entries (polynomial_multiplication: ~0.14 s each on one
core) and score completions. Every second spent for a sender is charged to it, and so are fixed
penalties for work that an honest peer never causes (a group whose question does not rebuild, an
answer that does not parse). A sender over its allowance is dropped for the rest of the round:
its remaining groups are neither rebuilt nor scored, and it is counted.

Keys are free, so a per-sender limit alone lets N fresh identities cost N times it. The round
also has a cap over all senders (`payload.round_budget_s`), split before any work among the
senders of the round (`split_round_budget`): half by merit, each sender's decayed count of groups
drawn into this node's batches (usable groups, at most a fair share of J per round, so offering
many groups earns no more), and half equally over every sender, so a newcomer can earn merit.
Merited senders are served first: the cap is checked before each rebuild or scoring, so N fresh
identities cost at most the cap plus one operation, and they cannot spend what the merited
senders were given. Hand-written: no library budgets work per untrusted sender.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

MERIT_DECAY = 0.9  # per round: ~10 rounds of memory
MERIT_SHARE = 0.5  # of the round cap, split by merit; the rest is split equally


def split_round_budget(cap_s: float, senders: list[str], merit: dict[str, float], limit_s: float) -> dict[str, float]:
    """Each sender's allowance: MERIT_SHARE of `cap_s` pro rata to merit, the rest equally; at most `limit_s`.

    With no merited sender the whole cap is split equally, so the allowances never sum to more than it.
    """
    if not senders:
        return {}
    if not math.isfinite(cap_s):
        return {s: limit_s for s in senders}
    merited = {s: merit[s] for s in senders if merit.get(s, 0.0) > 0}
    by_merit = MERIT_SHARE * cap_s if merited else 0.0
    equal = (cap_s - by_merit) / len(senders)
    total = sum(merited.values())
    return {s: min(limit_s, equal + (by_merit * merited[s] / total if s in merited else 0.0)) for s in senders}


class SenderBudget:
    def __init__(self, limit_s: float, clock: Callable[[], float] = time.perf_counter, round_limit_s: float = math.inf):
        self.limit_s, self.clock, self.round_limit_s = limit_s, clock, round_limit_s
        self.spent: Counter[str] = Counter()  # this round
        self.allowance: dict[str, float] = {}  # this round, from plan()
        self.dropped: set[str] = set()  # this round
        self.dropped_total = 0  # sender-rounds dropped since start
        self.rounds_capped = 0  # rounds in which senders together reached round_limit_s
        self.merit: dict[str, float] = {}  # decayed count of groups drawn into batches, across rounds
        # decayed count of groups that rebuilt and scored here (drawn or not): who ends a wait for peers
        self.delivered: dict[str, float] = {}

    @property
    def total(self) -> float:
        return sum(self.spent.values())

    def start_round(self) -> None:
        """Forget this round's spending; decay merit. Call once per round, before plan()."""
        self.spent.clear()
        self.dropped.clear()
        self.allowance.clear()
        for ledger in (self.merit, self.delivered):
            for s in list(ledger):
                ledger[s] *= MERIT_DECAY
                if ledger[s] < 1e-3:
                    del ledger[s]

    def plan(self, senders: Iterable[str]) -> list[str]:
        """Split the round cap over `senders`; return them in serving order: most merit first."""
        # stable: arrival order among ties
        order = sorted(dict.fromkeys(senders), key=lambda s: -self.merit.get(s, 0.0))
        self.allowance = split_round_budget(self.round_limit_s, order, self.merit, self.limit_s)
        return order

    def limit(self, sender: str) -> float:
        return self.allowance.get(sender, self.limit_s)

    def over(self, sender: str) -> bool:
        """True once `sender` is out of its allowance, or all senders are out of the round's cap."""
        return sender in self.dropped or self.total >= self.round_limit_s

    def charge(self, sender: str, seconds: float) -> None:
        capped = self.total >= self.round_limit_s
        self.spent[sender] += max(seconds, 0.0)
        if self.spent[sender] > self.limit(sender) and sender not in self.dropped:
            self.dropped.add(sender)
            self.dropped_total += 1
        if not capped and self.total >= self.round_limit_s:
            self.rounds_capped += 1

    def credit(self, sender: str, groups: int = 1) -> None:
        """`sender` had `groups` groups drawn into this node's batch."""
        self.merit[sender] = self.merit.get(sender, 0.0) + groups

    def deliver(self, sender: str, groups: int = 1) -> None:
        """`sender` sent `groups` groups that rebuilt and scored here this round."""
        self.delivered[sender] = self.delivered.get(sender, 0.0) + groups

    @contextmanager
    def timed(self, sender: str | None, extra_s: float = 0.0) -> Iterator[None]:
        """Charge `sender` the wall time of the block (none for this node's own work)."""
        t = self.clock()
        try:
            yield
        finally:
            if sender is not None:
                self.charge(sender, self.clock() - t + extra_s)
