"""Who is alive and how far along: gossip membership over the job's c10d store.

Each rank publishes, under keys of this job's namespace (`job_number`) of the store every worker
already shares (`World.store`):
- `progress/<rank>`: "incarnation,rounds done,finished" after each outer round (one `set`);
- `hb/<rank>`: a counter a daemon thread keeps in memory and `set`s every `interval_s`. A
  stopped (SIGSTOP) or dead process stops moving it, a slow one does not;
- `late/<rank>`: written by a partner that gave up waiting on <rank>: the rounds-done value
  <rank> had then. While <rank> has published no progress since, it is still late;
- `heal/<rank>/nonce`: this rank's current nonce as a donor; `heal/<donor>/<rank>/<incarnation>`:
  this incarnation's heal request to <donor>, signed over that nonce (core/comm/incarnation.py).

Partners read these before and while waiting on each other (see `PairExchange`), so that a
stopped or lagging rank costs at most one deadline wait, and a rank that wakes far behind
can see where the live ranks are. Everything read is untrusted (core/shared_store.py): nothing
here `add`s to a store key (torch's server cuts off a client whose `add` meets a non-integer),
values are read without blocking and parsed strictly, and a malformed one reads as "unknown",
is counted in `drops`, and never raises; the live round is a median, so one lying rank cannot
move it. A lost store connection is reopened by the heartbeat thread, which ends only at `stop`.
This is decentrain's own (torchft's Lighthouse needs a quorum per step; gossip needs none: the
store is enough, the launcher's on one host, the job store over several, core/comm/job_store.py).
"""

from __future__ import annotations

import logging
import secrets
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch.distributed as dist

from decentrain.core.comm.incarnation import NONCE_HEX, IncarnationCheck
from decentrain.core.shared_store import parse_count, peek

log = logging.getLogger(__name__)

_NONCES = 4  # a donor's latest nonces it still takes: a request signed just before a rotation is not stale
_FAILED = object()  # a store call that raised (as opposed to a key that holds nothing)


def job_number(store: dist.Store, rank: int, incarnation: int, world_size: int = 1, started: int = 0) -> int:
    """This gossip job's number: its namespace of the shared store is `job<n>` (a `dist.PrefixStore`
    prefix), so that two jobs run one after the other in one process group (a resume in place, a
    sweep, HDEE lanes) never read each other's keys.

    Agreed without a message: every rank counts the gossip jobs it started in this process group
    in memory (`started`, `World.gossip_jobs`), and every rank of a process group starts the same
    jobs in the same order. Each publishes its count at `jobs/<rank>` for a replacement
    (incarnation > 0), which has no count of its own and joins the job most ranks published: the
    median, so one forged value moves nobody, and a store client's write splits no job.
    """
    if incarnation == 0:
        n = started + 1
    else:
        counts, bad = [], 0
        for r in range(world_size):
            raw = peek(store, f"jobs/{r}")
            count = parse_count(raw)
            if raw is not None and not count:
                bad += 1
            elif count:
                counts.append(count)
        if bad:
            log.warning("rank %d: %d malformed gossip job counts in the store, not counted", rank, bad)
        n = statistics.median_low(counts) if counts else 1
    store.set(f"jobs/{rank}", str(n))
    return n


def job_prefix(store: dist.Store, rank: int, incarnation: int, world_size: int = 1, started: int = 0) -> str:
    return f"job{job_number(store, rank, incarnation, world_size, started)}"


@dataclass(frozen=True)
class Progress:
    incarnation: int
    done: int  # outer rounds completed (the round the rank works on next)
    finished: bool = False


def parse_progress(raw: bytes) -> Progress | None:
    """Decode a peer's `progress` value; None for anything malformed (never raises)."""
    parts = raw.split(b",") if isinstance(raw, bytes) and len(raw) <= 64 else []
    if len(parts) != 3:
        return None
    inc, done, fin = (parse_count(p) for p in parts)
    if inc is None or done is None or fin not in (0, 1):
        return None
    return Progress(inc, done, bool(fin))


def _parse_late(raw: bytes) -> int | None:
    return -1 if raw == b"-1" else parse_count(raw)


def _parse_nonce(raw: bytes) -> str | None:
    try:
        nonce = raw.decode("ascii")
    except (AttributeError, UnicodeDecodeError):
        return None
    return nonce if len(nonce) == NONCE_HEX and all(c in "0123456789abcdef" for c in nonce) else None


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
    # the launchers' public key and this rank's token (core/comm/incarnation.py); None: no heal request is honoured
    authority: IncarnationCheck | None = field(default_factory=IncarnationCheck.from_env)
    # opens a fresh connection: (this job's store, the launcher's store); None: a lost one stays lost
    reconnect: Callable[[], tuple[dist.Store, dist.Store]] | None = None
    drops: Counter = field(default_factory=Counter)  # values read and refused, by kind ("hb", "progress", "heal", ...)
    reconnects: int = 0  # store connections reopened
    beats: int = 0  # heartbeats written
    _hb: int = field(default=0, repr=False)  # this rank's heartbeat counter (the store holds a copy)
    _broken: bool = field(default=False, repr=False)  # a store call failed: the heartbeat thread reconnects
    _nonces: list = field(default_factory=list, repr=False)  # this rank's nonces as a donor, newest last
    _granted: set = field(default_factory=set, repr=False)  # (rank, incarnation, nonce) granted: a replay is not
    _asked: dict = field(default_factory=dict, repr=False)  # peer -> the heal request last read from it
    _newest: dict = field(default_factory=dict, repr=False)  # peer -> its newest incarnation a launcher started
    _seen: dict = field(default_factory=dict, repr=False)  # peer -> (heartbeat value, monotonic time it last changed)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _tick: threading.Condition = field(default_factory=threading.Condition, repr=False)  # notified after each beat
    _thread: threading.Thread | None = field(default=None, repr=False)

    # -- writing ----------------------------------------------------------------------
    def publish(self, done: int, finished: bool = False) -> None:
        self._write(f"progress/{self.rank}", f"{self.incarnation},{done},{int(finished)}")

    def mark_late(self, peer: int, done: int | None) -> None:
        """Record that `peer` missed a deadline while it had completed `done` rounds."""
        self._write(f"late/{peer}", str(-1 if done is None else done))

    def start_heartbeat(self) -> "Membership":
        if self._thread is None:
            self._beat()
            self.heal_requests()  # opens this rank as a donor: requests made before this process are stale
            self._thread = threading.Thread(target=self._run, daemon=True, name="membership-heartbeat")
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the heartbeat (and wait for it: a store call at interpreter exit aborts the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 5)

    def wait_beats(self, n: int, timeout_s: float) -> bool:
        """Wait until `n` heartbeats were written in all (False after `timeout_s`): for tests and tools
        that must order themselves on the heartbeat, not on time."""
        with self._tick:
            return self._tick.wait_for(lambda: self.beats >= n, timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self._broken and self.reconnect is not None:
                    self._reopen()
                self._beat()
            except Exception as e:  # noqa: BLE001 -- the heartbeat outlives any one failure; it ends at stop()
                self.drops["heartbeat_error"] += 1
                log.warning("rank %d: heartbeat failed (%s: %s); beating on", self.rank, type(e).__name__, e)

    def _beat(self) -> None:
        self._hb += 1
        if self._write(f"hb/{self.rank}", str(self._hb)):
            with self._tick:
                self.beats += 1
                self._tick.notify_all()

    def _reopen(self) -> None:
        try:
            self.store, self.launcher_store = self.reconnect()
        except (RuntimeError, OSError, ValueError) as e:  # the store is not back yet: the next beat tries again
            log.debug("rank %d: membership store reconnect failed: %s", self.rank, e)
            return
        self._broken = False
        self.reconnects += 1
        log.warning(
            "rank %d: lost the membership store connection; reconnected (%d so far)", self.rank, self.reconnects
        )

    # -- heal requests ----------------------------------------------------------------
    def request_heal(self, donor: int) -> bool:
        """Ask `donor` for its state: a request signed over the donor's current nonce (False if none was made)."""
        if self.authority is None:
            return False
        nonce = self._parsed("nonce", f"heal/{donor}/nonce", _parse_nonce)
        request = None if nonce is None else self.authority.heal_request(donor, nonce, self.rank, self.incarnation)
        if request is None:
            log.warning(
                "rank %d: no heal request to rank %d (%s)",
                self.rank,
                donor,
                "it published no nonce" if nonce is None else "this worker has no launcher token",
            )
            return False
        return self._write(f"heal/{donor}/{self.rank}/{self.incarnation}", request)

    def heal_requests(self) -> list[tuple[int, int]]:
        """(rank, incarnation) of replacements whose new requests to this rank hold, since the last call.

        Only the newest incarnation of each rank a launcher started is read (`heal/<this rank>/<rank>/<inc>`):
        a request of any other, forged or dead, is never looked at and cannot hide the real one's.
        """
        if self.authority is None:
            return []
        first = not self._nonces
        if first:  # requests signed over an earlier process's nonces are stale
            self._new_nonce()
        elif (said := self._read(f"heal/{self.rank}/nonce")) is not _FAILED and said != self._nonces[-1].encode():
            self.drops["nonce"] += 1  # someone overwrote or deleted it: say it again
            self._write(f"heal/{self.rank}/nonce", self._nonces[-1])
        out = []
        for peer in self._peers():
            inc = self._newest[peer] = self.authority.newest(
                self.launcher_store or self.store, peer, self._newest.get(peer, -1)
            )
            raw = self._read(f"heal/{self.rank}/{peer}/{inc}") if inc > 0 else None
            if raw is None or raw is _FAILED or raw == self._asked.get(peer):
                continue
            self._asked[peer] = raw
            if first:
                continue
            req = self.authority.read_request(raw, self.rank, peer)
            if (why := self._refusal(peer, inc, req)) is not None:
                self.drops[f"heal_{why.split(':')[0]}"] += 1
                log.warning(
                    "rank %d: ignoring a heal request from rank %d incarnation %d: %s", self.rank, peer, inc, why
                )
                continue
            self._granted.add((peer, *req))
            out.append((peer, inc))
        if out:
            self._new_nonce()  # each nonce opens at most one grant per incarnation
        return out

    def _refusal(self, peer: int, inc: int, req: tuple[int, str] | None) -> str | None:
        """Why a request at incarnation `inc`'s key (`read_request`'s reading of it) is not served; None if it is."""
        if req is None or req[0] != inc:
            return "unsigned: malformed, or not signed by the key a launcher certified for this incarnation"
        if req[1] not in self._nonces or (peer, *req) in self._granted:
            return "stale: signed over a nonce this rank did not issue, or one it already granted"
        return None

    def _new_nonce(self) -> None:
        self._nonces = [*self._nonces, secrets.token_hex(NONCE_HEX // 2)][-_NONCES:]
        self._granted = {g for g in self._granted if g[2] in self._nonces}
        self._write(f"heal/{self.rank}/nonce", self._nonces[-1])

    def replaced(self, rank: int, inc: int) -> bool:
        """A launcher started a later incarnation of `rank` than `inc` (whose progress keys are a dead worker's)."""
        return self.authority is not None and self.authority.superseded(self.launcher_store or self.store, rank, inc)

    # -- reading ----------------------------------------------------------------------
    def progress(self, peer: int) -> Progress | None:
        return self._parsed("progress", f"progress/{peer}", parse_progress)

    def late(self, peer: int, progress: Progress | None) -> bool:
        """True while `peer` missed a deadline and has published no progress since."""
        return progress is not None and self._parsed("late", f"late/{peer}", _parse_late) == progress.done

    def stalled_for(self, peer: int) -> float:
        """Seconds this rank has seen `peer`'s heartbeat not move (0 the first time it looks).

        A value that cannot be read or parsed is no evidence either way: the clock restarts, and
        the partner's deadline still bounds the wait."""
        raw = self._read(f"hb/{peer}")
        value = 0 if raw is None else None if raw is _FAILED else parse_count(raw)  # 0: not begun
        if value is None and raw is not _FAILED:
            self._drop("hb", peer)
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
        dones = [
            p.done
            for r in range(self.world_size)
            if r != self.rank and (p := self.progress(r)) is not None and not p.finished
        ]
        return int(statistics.median_low(dones)) if dones else None

    # -- the store --------------------------------------------------------------------
    def _peers(self) -> list[int]:
        return [p for p in range(self.world_size) if p != self.rank]

    def _parsed(self, kind: str, key: str, parse: Callable[[bytes], object]):
        """`parse` of the value at `key`; None when it is missing, unreadable or malformed (counted)."""
        raw = self._read(key)
        if raw is None or raw is _FAILED:
            return None
        value = parse(raw)
        if value is None:
            self._drop(kind, key)
        return value

    def _drop(self, kind: str, where: object) -> None:
        self.drops[kind] += 1
        n = self.drops[kind]
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, ...: a flood of bad values is not a flood of lines
            log.warning("rank %d: malformed %s value (%s) read as unknown (%d so far)", self.rank, kind, where, n)

    def _read(self, key: str):
        """The value at `key` (never waits), None if there is none, `_FAILED` if the store call failed."""
        try:
            return peek(self.store, key)
        except (RuntimeError, OSError, ValueError) as e:  # DistStoreError / DistNetworkError are RuntimeErrors
            return self._failed(e)

    def _write(self, key: str, value: str) -> bool:
        try:
            self.store.set(key, value)
            return True
        except (RuntimeError, OSError, ValueError) as e:
            self._failed(e)
            return False

    def _failed(self, e: Exception) -> object:
        """A store call failed (the connection is gone, or the store at the end of the job).

        The heartbeat reconnects at the next beat."""
        self._broken = True
        log.debug("rank %d: membership store call failed: %s", self.rank, e)
        return _FAILED
