"""What each sender may cost this node per round: rebuild + scoring time, plus fixed charges.

A peer's groups make this node rebuild entries (polynomial_multiplication: ~0.14 s each on one
core) and score completions. Every second spent for a sender is charged to it, and so are fixed
penalties for work that an honest peer never causes (a group whose question does not rebuild, an
answer that does not parse). A sender over its budget is dropped for the rest of the round:
its remaining groups are neither rebuilt nor scored, and it is counted.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator


class SenderBudget:
    def __init__(self, limit_s: float, clock: Callable[[], float] = time.perf_counter):
        self.limit_s, self.clock = limit_s, clock
        self.spent: Counter[str] = Counter()  # this round
        self.dropped: set[str] = set()  # this round
        self.dropped_total = 0  # sender-rounds dropped since start

    def start_round(self) -> None:
        self.spent.clear()
        self.dropped.clear()

    def over(self, sender: str) -> bool:
        return sender in self.dropped

    def charge(self, sender: str, seconds: float) -> None:
        self.spent[sender] += max(seconds, 0.0)
        if self.spent[sender] > self.limit_s and sender not in self.dropped:
            self.dropped.add(sender)
            self.dropped_total += 1

    @contextmanager
    def timed(self, sender: str | None, extra_s: float = 0.0) -> Iterator[None]:
        """Charge `sender` the wall time of the block (none for this node's own work)."""
        t = self.clock()
        try:
            yield
        finally:
            if sender is not None:
                self.charge(sender, self.clock() - t + extra_s)
