"""The pairwise exchange of flat buffers between the members of a gossip group.

`PairExchange.exchange` sends this rank's tensors to every partner of its group and
returns the partners' tensors (the mean, or any other use, is the caller's business).
Buffers are bucketed and framed by `core/comm/wire.py`: a fixed-size header first, a body only
of the agreed sizes. A partner is untrusted and may die at any time: every failure -- a
closed connection, a late partner, a wrong header, a bad checksum, non-finite values --
is counted and costs that round's exchange (None), never the run. When to give up on a
partner is `core/comm/wait_policy.py`'s decision.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

from decentrain.core.comm.buffer_pool import BufferPool
from decentrain.core.comm.deadline import ArrivalWindow
from decentrain.core.comm.membership import Membership
from decentrain.core.comm.pair_groups import PairGroups
from decentrain.core.comm.wait_policy import WaitPolicy
from decentrain.core.comm.wire import (
    FLAG_SKIP,
    HEADER_LEN,
    BodyCheck,
    Tags,
    flatten_buckets,
    header_problem,
    make_header,
    pack,
    skip_header,
    unpack,
)
from decentrain.core.world import World

log = logging.getLogger(__name__)


@dataclass
class ExchangeStats:
    rounds: int = 0
    timeouts: int = 0  # partner missed the deadline
    early_timeouts: int = 0  # of those, missed an adaptive deadline below the cap (what adaptivity cost)
    deadline_s: float | None = None  # the deadline of the last round (adaptive or fixed)
    failures: int = 0  # connection closed or refused (dead partner)
    rejected: int = 0  # header did not match: wrong magic, round, sizes or dtypes
    corrupt: int = 0  # body checksum differs from the header's
    nonfinite: int = 0  # body holds NaN/inf
    skipped: int = 0  # this rank or the partner skipped the round (someone still owed an earlier one)
    partner_skipped: int = 0  # membership said the partner is stopped, lagging or gone: not waited for
    bytes_sent: int = 0
    seconds: float = 0.0

    @property
    def dropped(self) -> int:
        return (
            self.timeouts
            + self.failures
            + self.rejected
            + self.corrupt
            + self.nonfinite
            + self.skipped
            + self.partner_skipped
        )


@dataclass
class _Inbox:
    """One partner's side of one round; its thread outlives a missed deadline and keeps the buffers alive."""

    peer: int
    incarnation: int = 0  # the partner's, when the round started: a replaced partner owes nothing
    received: threading.Event = field(default_factory=threading.Event)
    holds_body: bool = True  # False for a header-only (skip) exchange: nothing model-sized is kept
    status: str = "pending"  # ok | failed | rejected | corrupt | nonfinite | skipped
    arrived: float = 0.0  # perf_counter when the message was received and checked
    detail: str = ""
    bufs: list = field(default_factory=list)
    sends: list = field(default_factory=list)  # this rank's posted send works to the partner, this round
    thread: threading.Thread | None = None
    overdue: bool = False  # its sends outlived a deadline's wait in `_owes`: the partner is not reading them

    def sends_taken(self) -> bool:
        # the works' own state, not the thread's (alive while it waits for the GIL). On gloo that state only
        # turns completed once this inbox's thread has wait()ed on the work, however long ago the partner took it
        return all(w.is_completed() for w in self.sends)


class _SendRelease:
    """Gives a round's send buffers back to the pool once every partner's sends completed."""

    def __init__(self, pool: BufferPool | None, flats: list[torch.Tensor], users: int):
        self.pool, self.flats, self.users, self.ok = pool, flats, users, True
        self._lock = threading.Lock()

    def done(self, ok: bool) -> None:
        with self._lock:
            self.users -= 1
            self.ok = self.ok and ok
            last = self.users == 0
        if last and self.ok and self.pool is not None:
            self.pool.give(self.flats)


@dataclass
class PairExchange:
    """Exchange tensors with the other members of this rank's group.

    `deadline_s`: a partner that has not delivered within it costs this round's exchange
    (the call returns None), never the run. Its receive keeps running in a helper thread
    (gloo still writes into its buffers) and finishes when the partner delivers or its
    connection closes; until then that partner is not contacted again, so late buffers
    are bounded by one set per partner. A per-round tag keeps a late message from
    matching a later round.

    Device: gloo p2p on CUDA tensors aborts the process, so on gloo (and on NCCL with a
    deadline, which runs over gloo lanes because NCCL's wait does not block the host)
    buffers are staged through host memory; plain NCCL sends from `world.device`.

    `full_duplex()`: each ordered pair (src -> dst) then sends on a process group of its
    own, so the two directions cannot queue behind each other on one gloo pair (seen
    with a send-first swap: ~2x the floor on 100 Mbit/s links). With receives posted
    first, benchmarks/comm_sync measured the shared group as fast (1.11x vs 1.12x the
    floor), so this is a safeguard, not a must. It is collective over the whole world:
    call it at start-up, on every rank.
    """

    world: World
    bucket_bytes: int = 32 << 20
    deadline_s: float | None = None
    stats: ExchangeStats = field(default_factory=ExchangeStats)
    # with membership: a partner that is stopped, lagging or gone is skipped at once, or given up
    # on while waiting, instead of costing every pairing a full deadline
    membership: Membership | None = None
    stall_s: float | None = None  # give up on a partner whose heartbeat has not moved for this long
    # with pairs: every exchange runs on a 2-rank gloo group of its own (rebuilt when the partner is
    # replaced), not on the world group, so a replacement that never joined the world can take part
    pairs: PairGroups | None = None
    # with arrivals: the deadline follows observed arrival times (core/comm/deadline.py), deadline_s its cap
    arrivals: ArrivalWindow | None = None
    # reuse_buffers: send and receive buffers come from a pool (core/comm/buffer_pool.py), so the tensors
    # `exchange` returns are valid until the next `exchange` call only (copy them to keep them)
    reuse_buffers: bool = False
    _pool: BufferPool = field(default_factory=BufferPool, repr=False)
    _leased: list = field(default_factory=list, repr=False)  # receive buffers the caller holds until the next call
    _pending: list = field(default_factory=list, repr=False)  # _Inbox of rounds whose thread still runs
    _lanes: dict = field(default_factory=dict, repr=False)  # (src, dst) -> process group

    @property
    def _gloo_lanes_needed(self) -> bool:
        return self.world.backend == "nccl" and self.deadline_s is not None

    @property
    def stage_device(self) -> torch.device:
        """Where buffers handed to the p2p backend live: host for gloo, the rank's device for NCCL."""
        if self.world.backend == "nccl" and not self._gloo_lanes_needed and self.pairs is None:
            return self.world.device
        return torch.device("cpu")

    def check_transport(self) -> None:
        """Refuse a deadline that NCCL could not honour (call after full_duplex, at start-up)."""
        if self._gloo_lanes_needed and not self._lanes and self.pairs is None and self.world.world_size > 1:
            raise ValueError(
                "algorithm.deadline_s on NCCL needs the gloo side lanes of algorithm.full_duplex=true "
                "(NCCL's wait does not block the host, so a deadline there is not honest); "
                "set full_duplex=true or deadline_s=null"
            )

    def full_duplex(self, max_world: int = 64) -> "PairExchange":
        """Create one process group per direction of every rank pair (N·(N−1) groups)."""
        n = self.world.world_size
        if n > max_world:  # O(N²) groups: beyond this, exchange on the shared group
            return self
        if self.world.group is not None:
            # a sub-world (replicas × shards): new_group must be entered by every rank of the
            # default group in the same order, which the other sub-worlds don't do here
            return self
        backend = "gloo" if self._gloo_lanes_needed else None  # timed exchanges need a host-blocking wait
        ranks = list(range(n))
        for i in range(n):
            for j in range(i + 1, n):
                a, b = ranks[i], ranks[j]
                # every rank creates every group, in the same order (new_group is collective)
                self._lanes[(a, b)] = dist.new_group([a, b], backend=backend)
                self._lanes[(b, a)] = dist.new_group([a, b], backend=backend)
        return self

    def _global(self, rank: int) -> int:
        # p2p takes global ranks; a sub-world's ranks are indices into its group
        return rank if self.world.group is None else dist.get_global_rank(self.world.group, rank)

    def _lane(self, src: int, dst: int):
        return self._lanes.get((src, dst), self.world.group)

    def _incarnation(self, peer: int) -> int:
        p = self.membership.progress(peer) if self.membership is not None else None
        return 0 if p is None else p.incarnation

    def _owes(self, peer: int) -> bool:
        """True while `peer` owes an earlier round (not delivered yet) or has left two rounds of our sends untaken."""
        self._pending = [ib for ib in self._pending if ib.thread is not None and ib.thread.is_alive()]
        inc = self._incarnation(peer)  # what a dead incarnation owed, its replacement does not
        held = [ib for ib in self._pending if ib.peer == peer and ib.holds_body and ib.incarnation == inc]
        if any(not ib.received.is_set() for ib in held):
            return True
        untaken = [ib for ib in held if not ib.sends_taken()]
        if len(untaken) >= 2 and not untaken[0].overdue:
            # a thread a round behind on the CPU has not wait()ed on sends the partner did take (gloo reports them
            # completed only then; under tests/stress.sh a healthy duplex exchange skipped a round for it): give
            # the older one a deadline to end (an event), once; a partner that is not reading costs one deadline
            deadline = self.policy.deadline_s
            untaken[0].thread.join(deadline if deadline is not None else self.stall_s)
            untaken[0].overdue = untaken[0].thread.is_alive()
            untaken = [ib for ib in untaken if not ib.sends_taken()]
        return len(untaken) >= 2

    def drain(self, timeout_s: float) -> bool:
        """Wait until every late message of an earlier round has arrived (or `timeout_s` passed);
        True if none is still owed. For callers that must order rounds on events: tests, shutdown."""
        end = time.monotonic() + timeout_s
        return all(ib.received.wait(max(end - time.monotonic(), 0.0)) for ib in list(self._pending))

    @property
    def policy(self) -> WaitPolicy:
        deadline = (
            self.arrivals.deadline() if self.arrivals is not None and self.deadline_s is not None else self.deadline_s
        )
        return WaitPolicy(deadline, self.membership, self.stall_s)

    def exchange(
        self, tensors: Sequence[torch.Tensor], group: tuple[int, ...], round_idx: int
    ) -> list[list[torch.Tensor]] | None:
        """Send `tensors` to every other member of `group`; return each partner's tensors (in `group`
        order, shaped and typed like `tensors`), [] alone, or None if any partner's data is missing or bad."""
        peers = [p for p in group if p != self.world.rank]
        if self._leased:  # the caller's lease on the last round's buffers ends here
            self._pool.give(self._leased)
            self._leased = []
        if not peers:
            return []
        start = time.perf_counter()
        self.stats.rounds += 1
        policy = self.policy
        owing = [p for p in peers if self._owes(p)]
        if owing:
            # a partner still owes an earlier round: tell every partner with a header alone (no body is
            # kept or sent), so nobody waits on us and late buffers stay at one set per partner
            self.stats.skipped += 1
            log.warning(
                "round %d: partner(s) %s still owe an earlier round; skipping this round's averaging", round_idx, owing
            )
            self.skip_round(group, round_idx)
            return None
        absent = [(p, why) for p in peers if (why := policy.absent(p, round_idx, waiting=False))]
        if absent:
            self.stats.partner_skipped += 1
            log.warning(
                "round %d: not waiting for partner(s) %s; skipping this round's averaging",
                round_idx,
                ", ".join(f"{p} ({why})" for p, why in absent),
            )
            self.skip_round(group, round_idx)
            return None
        mine = [t.detach().contiguous() for t in tensors]
        buckets = flatten_buckets(mine, self.bucket_bytes)
        pool = self._pool if self.reuse_buffers else None
        flats = pack(mine, buckets, self.stage_device, pool)
        header = make_header(round_idx, flats, self.stage_device)
        release = _SendRelease(pool, flats, len(peers))
        inboxes = [self._start(p, header, flats, round_idx, release) for p in peers]
        ok = True
        self.stats.deadline_s = policy.deadline_s
        for ib in inboxes:
            outcome = policy.wait(ib.received, ib.peer, start, round_idx)
            if outcome == "timeout":
                self.stats.timeouts += 1
                if self.arrivals is not None:
                    self.arrivals.missed(policy.deadline_s)
                    self.stats.early_timeouts += policy.deadline_s < self.arrivals.cap
                log.warning(
                    "round %d: partner %d missed the %.3gs deadline; skipping this round's averaging",
                    round_idx,
                    ib.peer,
                    policy.deadline_s,
                )
                ok = False
            elif outcome is not None:
                self.stats.partner_skipped += 1
                log.warning(
                    "round %d: gave up on partner %d (%s); skipping this round's averaging", round_idx, ib.peer, outcome
                )
                ok = False
            elif ib.status != "ok":
                counter = "failures" if ib.status == "failed" else ib.status
                setattr(self.stats, counter, getattr(self.stats, counter) + 1)
                log.warning(
                    "round %d: dropped partner %d's message (%s: %s); skipping this round's averaging",
                    round_idx,
                    ib.peer,
                    ib.status,
                    ib.detail,
                )
                ok = False
            elif self.arrivals is not None:
                self.arrivals.arrived(ib.arrived - start)
        self._pending.extend(ib for ib in inboxes if ib.thread is not None and ib.thread.is_alive())
        self.stats.seconds += time.perf_counter() - start
        if not ok:
            return None
        if pool is not None:
            self._leased = [b for ib in inboxes for b in ib.bufs]
        return [unpack(ib.bufs, buckets, mine) for ib in inboxes]

    def skip_round(self, group: tuple[int, ...], round_idx: int) -> None:
        """Tell the other members of `group` with a header alone that this rank skips `round_idx`.

        Every rank posts exactly one header per partner and round, skipped or not, so the
        partner's receive for that round is always matched (and it learns of the skip at once).
        """
        peers = [p for p in group if p != self.world.rank]
        header = skip_header(round_idx, self.stage_device)
        self._pending.extend(self._start(p, header, [], round_idx) for p in peers)

    def _p2p(self, recvs: list, sends: list, peer: int, incarnation: int = 0) -> list:
        """Post receives and sends with `peer`; returns their works, receives first.

        NCCL builds a group's communicator on the first p2p call with a blocking two-rank
        rendezvous. With one lane per direction, "receives first" would have rank a start on
        lane (b, a) while b starts on (a, b), each waiting for the other: so ops are posted in
        lane order, and both ranks of a pair reach their shared lanes in the same order. On one
        shared communicator NCCL needs them batched (or it deadlocks).
        """
        if self.pairs is not None:  # (blocks on the first use of a pair: the group's rendezvous)
            pg, other = self.pairs.get(peer, incarnation)
            return [pg.recv([t], other, tag) for t, tag in recvs] + [pg.send([t], other, tag) for t, tag in sends]
        src = self._global(peer)
        rx, tx = self._lane(peer, self.world.rank), self._lane(self.world.rank, peer)
        if self.world.backend == "nccl" and rx is tx and self.stage_device.type != "cpu":
            ops = [dist.P2POp(dist.irecv, t, src, rx, tag) for t, tag in recvs]
            ops += [dist.P2POp(dist.isend, t, src, tx, tag) for t, tag in sends]
            return dist.batch_isend_irecv(ops) if ops else []
        me = self.world.rank
        posts = [
            ((peer, me), i, lambda t=t, tag=tag: dist.irecv(t, src=src, group=rx, tag=tag))
            for i, (t, tag) in enumerate(recvs)
        ]
        posts += [
            ((me, peer), len(recvs) + i, lambda t=t, tag=tag: dist.isend(t, dst=src, group=tx, tag=tag))
            for i, (t, tag) in enumerate(sends)
        ]
        if rx is not tx:  # by lane, (low, high) first; stable, so receives stay first on a shared group
            posts.sort(key=lambda post: post[0])
        works: list = [None] * len(posts)
        for _, i, post in posts:
            works[i] = post()
        return works

    def _start(
        self,
        peer: int,
        header: torch.Tensor,
        flats: list[torch.Tensor],
        round_idx: int,
        release: "_SendRelease | None" = None,
    ) -> _Inbox:
        ib = _Inbox(peer, self._incarnation(peer), holds_body=bool(flats))
        header_tag, tags = Tags.header(round_idx), Tags.buckets(round_idx, len(flats))

        def run() -> None:
            pending: list = []
            try:  # posting itself raises once a dead partner has closed the connection
                hdr = torch.empty(HEADER_LEN, dtype=torch.int64, device=header.device)
                works = self._p2p([(hdr, header_tag)], [(header, header_tag)], peer, ib.incarnation)
                pending = ib.sends = works[1:]  # one list: the body's sends join it below
                works[0].wait()
                if not flats:  # we skip this round: the partner learnt it from our header
                    ib.status, ib.detail = "skipped", "this rank skips the round"
                    return
                problem = "partner skips this round" if int(hdr[7]) & FLAG_SKIP else header_problem(hdr, header)
                if problem is not None:  # never post a body receive whose size the partner did not agree to
                    ib.status, ib.detail = ("skipped" if int(hdr[7]) & FLAG_SKIP else "rejected"), problem
                    return
                bufs = [self._pool.take_like(f) if self.reuse_buffers else torch.empty_like(f) for f in flats]
                works = self._p2p(list(zip(bufs, tags)), list(zip(flats, tags)), peer, ib.incarnation)
                self.stats.bytes_sent += sum(f.numel() * f.element_size() for f in flats)
                check = BodyCheck()
                for w, buf in zip(works[: len(bufs)], bufs):
                    w.wait()
                    check.add(buf)  # while the next buckets still arrive
                pending += works[len(bufs) :]
                if (problem := check.problem(hdr)) is not None:
                    ib.status, ib.detail = problem
                else:
                    ib.status, ib.bufs = "ok", bufs
            except RuntimeError as e:  # a dead peer breaks its pair; the run goes on
                ib.status, ib.detail = "failed", (str(e).splitlines() or [type(e).__name__])[0]
            finally:
                ib.arrived = time.perf_counter()
                ib.received.set()
                sent = True
                for w in pending:  # the send buffers stay alive (in this closure) until the partner took them
                    try:
                        w.wait()
                    except RuntimeError:
                        sent = False  # a send may still be in flight: its buffer never goes back to the pool
                        break
                if release is not None:  # a failed post may have left body sends in flight, unwaited
                    release.done(sent and ib.status != "failed")

        if self.deadline_s is None and self.world.backend == "nccl" and self.pairs is None:
            run()  # no deadline: NCCL work queues on the stream, no helper thread needed
        else:
            # gloo's p2p works never report is_completed() and a Work.wait(timeout) that
            # expires closes the pair's connection for good, so a helper thread does the
            # blocking waits and the caller gives it until the deadline.
            ib.thread = threading.Thread(target=run, daemon=True, name=f"pair-exchange-{peer}")
            ib.thread.start()
        return ib
