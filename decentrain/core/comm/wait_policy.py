"""When to stop waiting on a gossip partner: the skip rule over the membership keys.

Before waiting, a partner is skipped at once if it finished, already moved past this
round, is BEHIND+ rounds behind both us and the live ranks, or missed a deadline and has
published nothing since. While waiting, a heartbeat that stopped for `stall_s` (a stopped
or dead process) ends the wait early. So a fault costs each affected pair at most one
deadline; a partner held up by its own late partner gets its deadline from when it
publishes that round done.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from decentrain.core.comm.membership import Membership

BEHIND = 3  # a partner this many rounds behind (us and the live ranks) is skipped; it jumps ahead itself
POLL_S = 0.1  # how often a rank waiting on a partner re-reads the partner's membership keys


@dataclass
class WaitPolicy:
    deadline_s: float | None = None  # None: wait forever
    membership: Membership | None = None
    stall_s: float | None = None  # give up on a partner whose heartbeat has not moved for this long

    def absent(self, peer: int, round_idx: int, waiting: bool) -> str | None:
        """Why membership says `peer` will not (soon) deliver round `round_idx`; None if it may."""
        m = self.membership
        if m is None:
            return None
        p = m.progress(peer)
        if p is not None:
            if p.finished:
                return "finished"
            if p.done > round_idx:
                return f"already past round {round_idx}"
            # behind this round, and behind the live ranks too: a rank that ran ahead of the others
            # must wait for its partner (bounded by the deadline), or it would run away alone
            if not waiting and p.done + BEHIND <= round_idx and p.done + BEHIND <= (m.live_round() or round_idx):
                return f"{round_idx - p.done} rounds behind"
            if m.late(peer, p):
                return "missed a deadline, no progress since"
        if self.stall_s is not None and p is not None and (stalled := m.stalled_for(peer)) > self.stall_s:
            return f"no heartbeat for {stalled:.1f}s"
        return None

    def wait(self, received: threading.Event, peer: int, start: float, round_idx: int) -> str | None:
        """Wait for `received` until the deadline; None once set, "timeout", or why the partner was given up on."""
        if self.membership is None:
            return (
                None
                if received.wait(
                    None if self.deadline_s is None else max(0.0, self.deadline_s - (time.perf_counter() - start))
                )
                else "timeout"
            )
        first = self.membership.progress(peer)
        behind = first is not None and first.done < round_idx
        while True:
            left = None if self.deadline_s is None else max(0.0, self.deadline_s - (time.perf_counter() - start))
            if received.wait(POLL_S if left is None else min(POLL_S, left)):
                return None
            if (
                behind
                and self.deadline_s is not None
                and (p := self.membership.progress(peer)) is not None
                and p.done >= round_idx
            ):
                behind = False  # it has just reached this round: its deadline starts now
                start = min(time.perf_counter(), start + self.deadline_s)
                continue
            if left is not None and left <= POLL_S:
                outcome = "timeout"
            elif (why := self.absent(peer, round_idx, waiting=True)) is None:
                continue
            else:
                outcome = why
            if outcome == "timeout" or outcome.startswith("no heartbeat"):
                # others need not wait on it either, until it publishes progress again
                p = self.membership.progress(peer)
                self.membership.mark_late(peer, None if p is None else p.done)
            return outcome
