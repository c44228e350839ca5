"""Who is alive and how far along: gossip membership over the job's c10d store.

Each rank publishes, under keys of this job's namespace (`job_prefix`) of the store every worker
already shares (`World.store`):
- `progress/<rank>`: "incarnation,rounds done,finished" after each outer round (one `set`);
- `hb/<rank>`: a counter a daemon thread bumps every `interval_s` (one `add`). A stopped
  (SIGSTOP) or dead process stops bumping it, a slow one does not;
- `late/<rank>`: written by a partner that gave up waiting on <rank>: the rounds-done value
  <rank> had then. While <rank> has published no progress since, it is still late.

Partners read these before and while waiting on each other (see `PairExchange`), so that a
stopped or lagging rank costs at most one deadline wait, and a rank that wakes far behind
can see where the live ranks are. Everything read is untrusted: a malformed value reads as
"unknown", never raises; the live round is a median, so one lying rank cannot move it.
This is decentrain's own (torchft's Lighthouse needs a quorum per step; gossip needs none: the
store is enough, the launcher's on one host, the job store over several, core/comm/job_store.py).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from decentrain.core.launch.incarnation import IncarnationCheck

log = logging.getLogger(__name__)

_MAX_VALUE = 1 << 40  # rounds/incarnations beyond this are nonsense from a peer: read as unknown


def job_prefix(store: dist.Store, rank: int, incarnation: int) -> str:
    """This gossip job's own namespace of the shared store (a `dist.PrefixStore` prefix), so that two jobs run one after the other
    in one process group (a resume in place, a sweep, HDEE lanes) never read each other's keys.

    Agreed without a message: every rank counts the gossip jobs it started (`jobs/<rank>`), and
    every rank of a process group starts the same jobs in the same order. A replacement
    (incarnation > 0) joins the job its dead predecessor counted.
    """
    n = store.add(f"jobs/{rank}", 0 if incarnation else 1)
    return f"job{max(n, 1)}"


@dataclass(frozen=True)
class Progress:
    incarnation: int
    done: int  # outer rounds completed (the round the rank works on next)
    finished: bool = False


def parse_progress(raw: bytes) -> Progress | None:
    """Decode a peer's `progress` value; None for anything malformed (never raises)."""
    try:
        parts = raw.decode("ascii").split(",")
        if len(parts) != 3:
            return None
        inc, done, fin = (int(p) for p in parts)
    except (UnicodeDecodeError, ValueError):
        return None
    if not (0 <= inc < _MAX_VALUE and 0 <= done < _MAX_VALUE and fin in (0, 1)):
        return None
    return Progress(inc, done, bool(fin))


@dataclass
class Membership:
    """This rank's view of the others, read from and written to `store` (a `dist.Store`)."""

    store: dist.Store
    rank: int
    world_size: int
    incarnation: int = 0
    interval_s: float = 0.25  # heartbeat period
    # where the launcher records incarnations: the job's whole store, above this job's namespace
    # (None: `store` itself)
    launcher_store: dist.Store | None = None
    # the launchers' public key and this rank's token (core/launch/incarnation.py); None: no heal request is honoured
    authority: IncarnationCheck | None = field(default_factory=IncarnationCheck.from_env)
    _served: int | None = field(default=None, repr=False)  # heal requests already taken
    _granted: set = field(default_factory=set, repr=False)  # (rank, incarnation) served once: a replay is not
    _seen: dict = field(default_factory=dict, repr=False)  # peer -> (heartbeat value, monotonic time it last changed)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    # -- writing ----------------------------------------------------------------------
    def publish(self, done: int, finished: bool = False) -> None:
        self._safe(self.store.set, f"progress/{self.rank}", f"{self.incarnation},{done},{int(finished)}")

    def mark_late(self, peer: int, done: int | None) -> None:
        """Record that `peer` missed a deadline while it had completed `done` rounds."""
        self._safe(self.store.set, f"late/{peer}", str(-1 if done is None else done))

    def start_heartbeat(self) -> "Membership":
        if self._thread is None:
            def beat() -> None:
                while not self._stop.wait(self.interval_s):
                    if self._safe(self.store.add, f"hb/{self.rank}", 1) is None:
                        return  # the store is gone: the job is over
            self._safe(self.store.add, f"hb/{self.rank}", 1)
            self.heal_requests()  # marks the requests made before this process as taken
            self._thread = threading.Thread(target=beat, daemon=True, name="membership-heartbeat")
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the heartbeat (and wait for it: a store call at interpreter exit aborts the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 5)

    # -- heal requests: `heal/<donor>/n` counts them, `heal/<donor>/<i>` = "rank,incarnation,token" ----
    def request_heal(self, donor: int) -> None:
        n = self._safe(self.store.add, f"heal/{donor}/n", 1)
        if n is not None:
            token = self.authority.token if self.authority is not None else ""
            self._safe(self.store.set, f"heal/{donor}/{n}", f"{self.rank},{self.incarnation},{token}")

    def heal_requests(self) -> list[tuple[int, int]]:
        """(rank, incarnation) of replacements that asked this rank for its state since the last call."""
        if self._served is None:  # requests made before this process started were for a dead incarnation
            self._served = self._safe(self.store.add, f"heal/{self.rank}/n", 0) or 0
        n = self._safe(self.store.add, f"heal/{self.rank}/n", 0) or 0
        out = []
        while self._served < n:
            key = f"heal/{self.rank}/{self._served + 1}"
            if not self._safe(self.store.check, [key]):
                break  # counted but not written yet: next time
            self._served += 1
            raw = self._safe(self.store.get, key)
            try:
                rank_s, inc_s, token = raw[:512].decode("ascii").split(",")
                rank, inc = int(rank_s), int(inc_s)
            except (AttributeError, TypeError, UnicodeDecodeError, ValueError):
                continue
            if not (0 <= rank < self.world_size and rank != self.rank and 0 < inc < _MAX_VALUE):
                continue
            if (rank, inc) in self._granted:
                log.warning("rank %d: ignoring a repeated heal request of rank %d incarnation %d (served once)",
                            self.rank, rank, inc)
                continue
            if not self._launched(rank, inc, token):
                log.warning("rank %d: ignoring a heal request from rank %d incarnation %d, which no launcher "
                            "started", self.rank, rank, inc)
                continue
            self._granted.add((rank, inc))
            out.append((rank, inc))
        return out

    def replaced(self, rank: int, inc: int) -> bool:
        """A launcher started a later incarnation of `rank` than `inc` (whose progress keys are a dead worker's)."""
        return self.authority is not None and self.authority.superseded(self.launcher_store or self.store, rank, inc)

    def _launched(self, rank: int, inc: int, token: str) -> bool:
        """The launchers signed and recorded this incarnation, and started none after it."""
        return self.authority is not None and self.authority.started(self.launcher_store or self.store, rank, inc, token)

    # -- reading ----------------------------------------------------------------------
    def progress(self, peer: int) -> Progress | None:
        key = f"progress/{peer}"
        if not self._safe(self.store.check, [key]):
            return None
        raw = self._safe(self.store.get, key)
        return None if raw is None else parse_progress(raw)

    def late(self, peer: int, progress: Progress | None) -> bool:
        """True while `peer` missed a deadline and has published no progress since."""
        key = f"late/{peer}"
        if progress is None or not self._safe(self.store.check, [key]):
            return False
        raw = self._safe(self.store.get, key)
        try:
            return raw is not None and int(raw.decode("ascii")) == progress.done
        except (UnicodeDecodeError, ValueError):
            return False

    def stalled_for(self, peer: int) -> float:
        """Seconds this rank has seen `peer`'s heartbeat not move (0 the first time it looks)."""
        value = self._safe(self.store.add, f"hb/{peer}", 0)  # add 0: reads without blocking on a missing key
        now = time.monotonic()
        last = self._seen.get(peer)
        if value is None or last is None or last[0] != value:
            self._seen[peer] = (value, now)
            return 0.0
        return now - last[1]

    def stopped(self, peer: int, stall_s: float) -> bool:
        """`peer`'s heartbeat began and has not moved for `stall_s`: it died (or was stopped) after it started.
        A peer that has not beaten yet is still starting, not stopped."""
        stalled = self.stalled_for(peer)
        return bool(self._seen[peer][0]) and stalled > stall_s

    def live_round(self) -> int | None:
        """Median rounds-done of the other ranks still training (None if none published)."""
        dones = [p.done for r in range(self.world_size)
                 if r != self.rank and (p := self.progress(r)) is not None and not p.finished]
        return int(statistics.median_low(dones)) if dones else None

    def _safe(self, fn, *args):
        """A store call that never raises: the store may be gone at the end of the job."""
        try:
            return fn(*args)
        except (RuntimeError, OSError, ValueError) as e:  # DistStoreError is a RuntimeError
            log.debug("membership store call %s failed: %s", getattr(fn, "__name__", fn), e)
            return None
