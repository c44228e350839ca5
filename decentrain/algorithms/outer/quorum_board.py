"""Where the replicas of one job meet for quorum rounds: a board on a c10d store, and its clocks.

The board holds, per round, the deliveries posted to it (a counter and one small JSON entry each),
the members' payloads (bytes: a DiLoCo Δ in fp32, a SparseLoCo message; put only for a round that does
not run as the lock-step collective, by each member once it reads the record), and the round's record,
written once: `compare_set` on an empty key, so when two replicas close a round at the same moment
the first record stands and both read it back. Payloads older than `retain_rounds` are deleted by
whoever closes a round. Everything read back is decoded by outer/quorum.py's total decoders; an
entry that does not decode is dropped and counted (`dropped`).

Stores: `torch.distributed.HashStore` for replicas that are threads of one process (transport=inprocess),
the job's own c10d store (a `PrefixStore` of `world.store`) across processes. The c10d store is one
server: the payloads of rounds that did not close with every replica pass through it, so the board
suits the models this library trains on a store; the on-time round itself runs on the transport's
collective (outer/rounds.py).

Clocks: `RealClock` waits on a condition that in-process writes notify, re-reading the board every
`poll_s` for writes of other processes. `SimClock` is virtual time for tests and simulations: the
replicas are threads of which one runs at a time, always the one whose next event is earliest (a
discrete-event simulation), each inner step costs what the schedule says, and a scripted outage
stops a replica between two times. Both give the board `now`, `wait` and `notify`.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from decentrain.algorithms.outer.quorum import Delivery, RoundRecord, decode_delivery, decode_record
from decentrain.core.comm.dist_transport import TorchTransport
from decentrain.core.comm.inprocess_transport import InProcessHub, InProcessTransport
from decentrain.core.comm.membership import job_number
from decentrain.core.comm.transport import Transport

log = logging.getLogger(__name__)

PAYLOAD_WAIT_S = 600.0  # a member puts its payload as soon as it reads its round's record: longer is a dead member


# -- clocks ---------------------------------------------------------------------------------
class RealClock:
    """Wall time; `wait` wakes on an in-process `notify` or every `poll_s` (writes of other processes)."""

    collectives_ok = True  # replicas wait in real time: a collective among them cannot deadlock a scheduler

    def __init__(self, poll_s: float = 0.05):
        self.poll_s = poll_s
        self._cond = threading.Condition()
        self._version = 0

    def now(self, rank: int) -> float:
        return time.monotonic()

    def spend(self, rank: int, steps: int) -> "Outage | None":
        return None  # the steps took their real time already

    def sleep_until(self, rank: int, t: float) -> None:
        time.sleep(max(0.0, t - time.monotonic()))

    def wait(self, rank: int, until: float | None) -> None:
        """Return after a notify, at `until`, or after poll_s, whichever is first (the caller re-reads)."""
        with self._cond:
            seen = self._version
            left = self.poll_s if until is None else min(self.poll_s, until - time.monotonic())
            if left > 0:
                self._cond.wait_for(lambda: self._version != seen, timeout=left)

    def notify(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def enter(self, rank: int) -> None:
        pass

    def exit(self, rank: int) -> None:
        pass


@dataclass(frozen=True)
class Outage:
    """A scripted failure: replica down from `start` (its unsynced work lost), noticed by the others at
    `detected` (a heartbeat timeout), back at `end` (restarted, about to catch up)."""

    start: float
    end: float
    detected: float | None = None  # None: at start

    @property
    def noticed(self) -> float:
        return self.start if self.detected is None else self.detected


class SimulationError(RuntimeError):
    pass


class SimClock:
    """Virtual time for `world_size` replica threads, one running at a time (a discrete-event simulation).

    `step_seconds(rank, t, i)` is the cost of replica `rank`'s i-th inner step started at virtual time t
    (stragglers: a larger cost), `sync_s` what each sync adds to it (the payload's time on the link);
    `outages[rank]` are its scripted failures. A replica that waits gives up
    the run to the replica with the earliest next event (ties: the lower rank), so the results are a
    function of the schedule alone, however loaded the machine is. An outage takes effect at the
    replica's next spending of steps: its start falls in that span, or passed while it waited.
    """

    collectives_ok = False  # one thread runs at a time: a collective would wait for threads that cannot run

    def __init__(
        self,
        world_size: int,
        step_seconds: Callable[[int, float, int], float],
        outages: dict[int, list[Outage]] | None = None,
        sync_s: float = 0.0,
        stuck_s: float = 600.0,
    ):
        self.n, self.step_seconds, self.sync_s, self.stuck_s = world_size, step_seconds, sync_s, stuck_s
        self.pending = {r: sorted(o, key=lambda x: x.start) for r, o in (outages or {}).items()}
        self.t = [0.0] * world_size  # each replica's virtual time
        self.steps = [0] * world_size
        self._wake: dict[int, float] = {}  # rank -> when it is next due (inf: only a notify wakes it)
        self._waiting: set[int] = set()  # ranks waiting on the board (a notify wakes them)
        self._entered: set[int] = set()
        self._done: set[int] = set()
        self._running: int | None = None
        self._cond = threading.Condition()
        self._error: BaseException | None = None

    # -- the scheduler ------------------------------------------------------------------------
    def enter(self, rank: int) -> None:
        with self._cond:
            self._entered.add(rank)
            self._wake[rank] = 0.0
            if len(self._entered) == self.n:
                self._pick()
            self._block(rank)

    def exit(self, rank: int) -> None:
        with self._cond:
            self._done.add(rank)
            self._wake.pop(rank, None)
            if self._running in (rank, None):
                self._pick()

    def abort(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def _pick(self) -> None:
        ready = [(w, r) for r, w in self._wake.items() if r not in self._done]
        self._running = None
        if ready:
            wake, rank = min(ready)
            if math.isinf(wake):
                self._error = SimulationError(f"replicas {sorted(self._wake)} all wait for a change that cannot come")
            else:
                self._running = rank
                self.t[rank] = max(self.t[rank], wake)
        self._cond.notify_all()

    def _block(self, rank: int) -> None:
        """Wait (the lock held) until this replica runs; a run that stops moving for stuck_s is an error."""
        while self._running != rank:
            if self._error is not None:
                raise SimulationError(f"simulation stopped: {self._error!r}")
            if not self._cond.wait(self.stuck_s):
                self._error = SimulationError(f"no replica ran for {self.stuck_s:.0f}s (one died holding the run?)")
        self._wake.pop(rank, None)

    def _yield(self, rank: int, wake: float) -> None:
        with self._cond:
            self._wake[rank] = wake
            self._pick()
            self._block(rank)

    # -- what replicas call ---------------------------------------------------------------------
    def now(self, rank: int) -> float:
        return self.t[rank]

    def spend(self, rank: int, steps: int) -> Outage | None:
        """Advance through `steps` inner steps and a sync; an outage due by their end stops the replica at its start."""
        start = t = self.t[rank]
        for _ in range(steps):
            t += self.step_seconds(rank, t, self.steps[rank])
            self.steps[rank] += 1
        t += self.sync_s
        queue = self.pending.get(rank, [])
        if queue and queue[0].start < t:
            o = queue.pop(0)
            down = max(o.start, start)
            o = Outage(down, max(o.end, down), None if o.detected is None else max(o.detected, down))
            self._yield(rank, down)
            return o
        self._yield(rank, t)
        return None

    def sleep_until(self, rank: int, t: float) -> None:
        self._yield(rank, max(t, self.t[rank]))

    def wait(self, rank: int, until: float | None) -> None:
        with self._cond:
            self._waiting.add(rank)
        try:
            self._yield(rank, math.inf if until is None else max(until, self.t[rank]))
        finally:
            with self._cond:
                self._waiting.discard(rank)

    def notify(self) -> None:
        """The board changed: every replica waiting on it looks again at the current time."""
        with self._cond:
            now = self.t[self._running] if self._running is not None else 0.0
            for r in self._waiting:
                if r in self._wake:
                    self._wake[r] = min(self._wake[r], now)


# -- the board --------------------------------------------------------------------------------
class Board:
    """Rounds on a c10d store (keys under this board's prefix), read through the total decoders."""

    def __init__(self, store: dist.Store, world_size: int, clock: RealClock | SimClock, window: int = 32):
        self.store, self.n, self.clock, self.window = store, world_size, clock, window
        self.dropped = 0  # entries that did not decode

    def _get(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None

    # deliveries and payloads
    def post(self, round_idx: int, d: Delivery, payload: bytes | None) -> None:
        """The payload first (when given), then the delivery entry: a counted delivery with an eager payload
        always has it; a deferred one is put by `put_payload` once the record names it a member."""
        if payload is not None:
            self.put_payload(round_idx, d.rank, d.base, payload)
        k = self.store.add(f"r{round_idx}/n", 1)
        self.store.set(f"r{round_idx}/d{k}", d.encode())
        self.clock.notify()

    def put_payload(self, round_idx: int, rank: int, base: int, payload: bytes) -> None:
        self.store.set(f"r{round_idx}/p{rank}.{base}", payload)

    def deliveries(self, round_idx: int) -> list[Delivery] | None:
        """Every delivery posted to the round, in posting order; None while one is still being written."""
        n = self.store.add(f"r{round_idx}/n", 0)
        out = []
        for k in range(1, n + 1):
            raw = self._get(f"r{round_idx}/d{k}")
            if raw is None:
                return None
            d = decode_delivery(raw, self.n, round_idx)
            if d is None:
                self.dropped += 1
                log.warning("quorum round %d: delivery %d does not decode; dropped", round_idx, k)
                continue
            out.append(d)
        return out

    def payload(self, round_idx: int, rank: int, base: int) -> bytes:
        key = f"r{round_idx}/p{rank}.{base}"
        self.store.wait([key], timedelta(seconds=PAYLOAD_WAIT_S))
        return self.store.get(key)

    # records
    def record(self, round_idx: int) -> RoundRecord | None:
        raw = self._get(f"r{round_idx}/rec")
        if raw is None:
            return None
        rec = decode_record(raw, self.n, round_idx, self.window)
        if rec is None:
            raise RuntimeError(
                f"quorum round {round_idx}: the board's record does not decode; the replicas cannot agree"
            )
        return rec

    def publish(self, rec: RoundRecord, retain: int) -> RoundRecord:
        """Write `rec` unless another replica closed the round first; the record that stands."""
        key = f"r{rec.round}/rec"
        won = self.store.compare_set(key, "", rec.encode())
        self.clock.notify()
        stands = self.record(rec.round)
        if won == rec.encode():
            self._prune(rec.round - retain)
        return stands

    def _prune(self, old: int) -> None:
        if old < 0:
            return
        n = self.store.add(f"r{old}/n", 0)
        for k in range(1, n + 1):
            d = decode_delivery(self._get(f"r{old}/d{k}"), self.n, old)
            if d is not None:
                self.store.delete_key(f"r{old}/p{d.rank}.{d.base}")

    # who is in
    def leave(self, rank: int) -> None:
        self.store.set(f"left/{rank}", "1")
        self.clock.notify()

    def join(self, rank: int) -> None:
        self.store.set(f"left/{rank}", "0")
        self.clock.notify()

    def live(self) -> set[int]:
        return {r for r in range(self.n) if self._get(f"left/{r}") != b"1"}


# -- one board per job ---------------------------------------------------------------------------
_SHARED: "weakref.WeakKeyDictionary[InProcessHub, Board]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def use_board(hub: InProcessHub, board: Board) -> None:
    """Make `board` the one the replicas of `hub` meet on (a simulation's board with its SimClock)."""
    with _LOCK:
        _SHARED[hub] = board


@functools.singledispatch
def board_for(transport: Transport, world_size: int, poll_s: float, window: int) -> Board:
    raise ValueError(
        f"algorithm.rounds.mode=quorum needs a board its replicas share; transport "
        f"{type(transport).__name__} offers none (allowed: transport=torch, transport=inprocess)"
    )


@board_for.register
def _(transport: InProcessTransport, world_size: int, poll_s: float, window: int) -> Board:
    with _LOCK:  # the replicas are threads of this process: one HashStore for all of them
        board = _SHARED.get(transport.hub)
        if board is None:
            board = _SHARED[transport.hub] = Board(dist.HashStore(), world_size, RealClock(poll_s), window)
        return board


@board_for.register
def _(transport: TorchTransport, world_size: int, poll_s: float, window: int) -> Board:
    w = transport.world
    if w.store is None:
        raise ValueError("algorithm.rounds.mode=quorum needs the job's c10d store (a torchrun launch)")
    # the job's own namespace, numbered as gossip jobs are (core/comm/membership.job_number): two runs one
    # after the other in one process group (HDEE's lanes, a resume in place) never read each other's rounds
    w.gossip_jobs = job_number(w.store, w.rank, w.incarnation, w.world_size, w.gossip_jobs)
    return Board(dist.PrefixStore(f"job{w.gossip_jobs}/quorum_rounds/", w.store), world_size, RealClock(poll_s), window)
