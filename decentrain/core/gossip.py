"""Gossip pairing and the pairwise exchange of flat buffers.

Pairing needs no messages: every rank derives the same random perfect matching for
round t from a shared seed. The exchange then moves bucketed flat buffers between
the members of a group with async send/recv and an optional deadline.

A partner is untrusted and may die at any time: a fixed-size header (magic, round,
layout digest, checksum) travels first, and a body receive is posted only once the
header says the body has exactly the sizes and dtypes this rank expects (gloo aborts
the whole process, uncatchably, when a message is larger than its receive buffer).
Every failure -- a closed connection, a late partner, a wrong header, a bad checksum,
non-finite values -- is counted and costs that round's averaging, never the run.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import torch
import torch.distributed as dist

from decentrain.core.membership import Membership
from decentrain.core.pairs import PairGroups
from decentrain.core.world import World

log = logging.getLogger(__name__)

OddPolicy = Literal["idle", "triple", "error"]
ODD_POLICIES = ("idle", "triple", "error")


def gossip_groups(
    round_idx: int, world_size: int, seed: int | None = None, odd: OddPolicy = "error", *, inner_steps: int | None = None
) -> list[tuple[int, ...]]:
    """The random matching of round `round_idx` (0-based): disjoint groups covering 0..world_size-1.

    Two streams, both `rng.permutation(N)` with pairs {perm[j], perm[j + N/2]}:
    - `seed=None`: the official NoLoCo code's sequence. It keys the permutation by the
      inner-step counter at the sync, `default_rng(k·H + 1)` at the k-th sync (k = round_idx + 1),
      so it needs `inner_steps=H`. Every rank must pass the same H (the configured one, also
      when adaptive pacing runs fewer steps on a slow rank).
    - an int seed: `default_rng([seed, round_idx])`, decentrain's own stream, independent per
      seed (not the reference sequence).

    Odd worlds: `idle` leaves the last rank of the permutation alone for the round
    (a singleton group that keeps its own weights); `triple` adds it to the first pair;
    `error` refuses.
    """
    if seed is None and (inner_steps is None or inner_steps < 1):
        raise ValueError(f"inner_steps={inner_steps}: the reference pairing (seed=None) is keyed by k*H and needs H >= 1")
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if odd not in ODD_POLICIES:
        raise ValueError(f"odd={odd!r} is unknown; allowed: {list(ODD_POLICIES)}")
    if world_size % 2 and odd == "error" and world_size > 1:
        raise ValueError(f"world_size={world_size} is odd and cannot be paired; set the odd-world policy to 'idle' or 'triple'")
    rng = np.random.default_rng((round_idx + 1) * inner_steps + 1 if seed is None else [seed, round_idx])
    perm = [int(p) for p in rng.permutation(world_size)]
    half = world_size // 2
    groups: list[tuple[int, ...]] = [(perm[j], perm[j + half]) for j in range(half)]
    if world_size % 2:
        last = perm[-1]
        if odd == "triple" and groups:
            groups[0] = groups[0] + (last,)
        else:
            groups.append((last,))
    return groups


def group_of(rank: int, groups: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    for g in groups:
        if rank in g:
            return g
    raise ValueError(f"rank {rank} is in no group of {groups}")


def flatten_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Split tensor indices into consecutive buckets of at most `bucket_bytes` (one tensor may exceed it).

    A bucket holds one dtype: concatenating bf16 weights with an fp32 tensor would
    promote, and so double, the whole bucket on the wire.
    """
    buckets: list[list[int]] = [[]]
    size = 0
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        if buckets[-1] and (size + nbytes > bucket_bytes or tensors[buckets[-1][0]].dtype != t.dtype):
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return [b for b in buckets if b]


@dataclass
class ExchangeStats:
    rounds: int = 0
    timeouts: int = 0  # partner missed the deadline
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
        return self.timeouts + self.failures + self.rejected + self.corrupt + self.nonfinite + self.skipped + self.partner_skipped


MAGIC = 0x6463_7472_6E67  # "dctrng"
VERSION = 1
HEADER_LEN = 8  # [magic, version, round, n_buckets, layout digest, total numel, checksum, flags]
FLAG_SKIP = 1  # the sender skips this round: no body follows
HEADER_TAG = 1023  # the bucket slot of a round's tag reserved for the header
BEHIND = 3  # a partner this many rounds behind (us and the live ranks) is skipped; it jumps ahead itself
POLL_S = 0.1  # how often a rank waiting on a partner re-reads the partner's membership keys
_MASK = (1 << 62) - 1
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def layout_digest(flats: Sequence[torch.Tensor]) -> int:
    """CRC32 of the (numel, dtype) of every bucket: equal digests mean equal receive sizes."""
    return zlib.crc32(";".join(f"{f.numel()}:{f.dtype}" for f in flats).encode())


def checksum(flats: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum of the raw bit patterns (as int64, wrapping) of every bucket, mod 2**62, as a 1-element tensor.

    Computed where the buffers live, with no host sync: the sender's header stays on the
    backend's device (NCCL) and the check costs one pass over the weights.
    """
    total = torch.zeros((), dtype=torch.int64, device=flats[0].device if flats else "cpu")
    for f in flats:
        total = total + f.reshape(-1).view(_INT_VIEW[f.element_size()]).sum(dtype=torch.int64)
    return (total & _MASK).reshape(1)


def make_header(round_idx: int, flats: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    fixed = torch.tensor([MAGIC, VERSION, round_idx, len(flats), layout_digest(flats), sum(f.numel() for f in flats)],
                         dtype=torch.int64, device=device)
    return torch.cat([fixed, checksum(flats).to(device), torch.zeros(1, dtype=torch.int64, device=device)])


def header_problem(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Why a received header is not the one this round expects (None if it is)."""
    g, e = got.tolist(), expected.tolist()
    for i, name in enumerate(("magic", "version", "round", "bucket count", "layout (sizes/dtypes)", "numel")):
        if g[i] != e[i]:
            return f"{name} {g[i]} != expected {e[i]}"
    return None


@dataclass
class _Inbox:
    """One partner's side of one round; its thread outlives a missed deadline and keeps the buffers alive."""

    peer: int
    incarnation: int = 0  # the partner's, when the round started: a replaced partner owes nothing
    received: threading.Event = field(default_factory=threading.Event)
    holds_body: bool = True  # False for a header-only (skip) exchange: nothing model-sized is kept
    status: str = "pending"  # ok | failed | rejected | corrupt | nonfinite | skipped
    detail: str = ""
    bufs: list = field(default_factory=list)
    thread: threading.Thread | None = None


@dataclass
class PairExchange:
    """Average tensors with the other members of this rank's group.

    `deadline_s`: a partner that has not delivered within it costs this round's averaging
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
            raise ValueError("algorithm.deadline_s on NCCL needs the gloo side lanes of algorithm.full_duplex=true "
                             "(NCCL's wait does not block the host, so a deadline there is not honest); "
                             "set full_duplex=true or deadline_s=null")

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
        return any(not ib.received.is_set() for ib in held) or len(held) >= 2

    def average(self, tensors: Sequence[torch.Tensor], group: tuple[int, ...], round_idx: int) -> list[torch.Tensor] | None:
        """Return the group mean of each tensor (a new list), or None if any partner's data is missing or bad."""
        peers = [p for p in group if p != self.world.rank]
        if not peers:
            return [t.clone() for t in tensors]
        start = time.perf_counter()
        self.stats.rounds += 1
        stage = self.stage_device
        owing = [p for p in peers if self._owes(p)]
        if owing:
            # a partner still owes an earlier round: tell every partner with a header alone (no body is
            # kept or sent), so nobody waits on us and late buffers stay at one set per partner
            self.stats.skipped += 1
            log.warning("round %d: partner(s) %s still owe an earlier round; skipping this round's averaging", round_idx, owing)
            self.skip_round(group, round_idx)
            return None
        absent = [(p, why) for p in peers if (why := self._absent(p, round_idx, waiting=False))]
        if absent:
            self.stats.partner_skipped += 1
            log.warning("round %d: not waiting for partner(s) %s; skipping this round's averaging", round_idx,
                        ", ".join(f"{p} ({why})" for p, why in absent))
            self.skip_round(group, round_idx)
            return None
        mine = [t.detach().contiguous() for t in tensors]
        buckets = flatten_buckets(mine, self.bucket_bytes)
        # always a copy on the staging device: a send may outlive this call when a partner is late
        flats = [torch.cat([mine[i].reshape(-1) for i in idx]).to(stage) if len(idx) > 1 else mine[idx[0]].reshape(-1).to(stage, copy=True)
                 for idx in buckets]
        header = make_header(round_idx, flats, stage)
        inboxes = [self._start(p, header, flats, round_idx) for p in peers]
        ok = True
        for ib in inboxes:
            outcome = self._await(ib, start, round_idx)
            if outcome == "timeout":
                self.stats.timeouts += 1
                log.warning("round %d: partner %d missed the %.3gs deadline; skipping this round's averaging",
                            round_idx, ib.peer, self.deadline_s)
                ok = False
            elif outcome is not None:
                self.stats.partner_skipped += 1
                log.warning("round %d: gave up on partner %d (%s); skipping this round's averaging", round_idx, ib.peer, outcome)
                ok = False
            elif ib.status != "ok":
                counter = "failures" if ib.status == "failed" else ib.status
                setattr(self.stats, counter, getattr(self.stats, counter) + 1)
                log.warning("round %d: dropped partner %d's message (%s: %s); skipping this round's averaging",
                            round_idx, ib.peer, ib.status, ib.detail)
                ok = False
        self._pending.extend(ib for ib in inboxes if ib.thread is not None and ib.thread.is_alive())
        self.stats.seconds += time.perf_counter() - start
        if not ok:
            return None
        sums = [t.float() for t in mine]  # may alias the caller's fp32 tensors: add out of place
        for ib in inboxes:
            for idx, buf in zip(buckets, ib.bufs):
                offset = 0
                for i in idx:
                    n = mine[i].numel()
                    sums[i] = sums[i] + buf[offset : offset + n].view_as(mine[i]).to(mine[i].device).float()
                    offset += n
        return [s.div_(len(group)).to(t.dtype) for s, t in zip(sums, mine)]

    def skip_round(self, group: tuple[int, ...], round_idx: int) -> None:
        """Tell the other members of `group` with a header alone that this rank skips `round_idx`.

        Every rank posts exactly one header per partner and round, skipped or not, so the
        partner's receive for that round is always matched (and it learns of the skip at once).
        """
        peers = [p for p in group if p != self.world.rank]
        header = torch.tensor([MAGIC, VERSION, round_idx, 0, 0, 0, 0, FLAG_SKIP], dtype=torch.int64, device=self.stage_device)
        self._pending.extend(self._start(p, header, [], round_idx) for p in peers)

    def _absent(self, peer: int, round_idx: int, waiting: bool) -> str | None:
        """Why membership says `peer` will not (soon) deliver round `round_idx`; None if it may.

        Before waiting: it is finished, already past this round (it gave up on us), BEHIND or
        more rounds behind, or late (missed a deadline and published no progress since). While
        waiting, the same minus "behind", plus a heartbeat that stopped moving (a stopped or
        dead process) for `stall_s`.
        """
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

    def _await(self, ib: _Inbox, start: float, round_idx: int) -> str | None:
        """Wait for `ib` until the deadline; None once received, "timeout", or why the partner was given up on.

        With membership, a partner still finishing the previous round (held up by its own late
        partner) gets its deadline from when it publishes that round done, up to twice the
        deadline in all: a fault's wait is then not passed on as a second lost round.
        """
        if self.membership is None:
            return None if ib.received.wait(None if self.deadline_s is None else
                                            max(0.0, self.deadline_s - (time.perf_counter() - start))) else "timeout"
        first = self.membership.progress(ib.peer)
        behind = first is not None and first.done < round_idx
        while True:
            left = None if self.deadline_s is None else max(0.0, self.deadline_s - (time.perf_counter() - start))
            if ib.received.wait(POLL_S if left is None else min(POLL_S, left)):
                return None
            if behind and self.deadline_s is not None and (p := self.membership.progress(ib.peer)) is not None \
                    and p.done >= round_idx:
                behind = False  # it has just reached this round: its deadline starts now
                start = min(time.perf_counter(), start + self.deadline_s)
                continue
            if left is not None and left <= POLL_S:
                outcome = "timeout"
            elif (why := self._absent(ib.peer, round_idx, waiting=True)) is None:
                continue
            else:
                outcome = why
            if outcome == "timeout" or outcome.startswith("no heartbeat"):
                # others need not wait on it either, until it publishes progress again
                p = self.membership.progress(ib.peer)
                self.membership.mark_late(ib.peer, None if p is None else p.done)
            return outcome

    def _p2p(self, recvs: list, sends: list, peer: int, incarnation: int = 0) -> list:
        """Post receives and sends with `peer`; NCCL on one communicator needs them batched (or it deadlocks)."""
        if self.pairs is not None:  # (blocks on the first use of a pair: the group's rendezvous)
            pg, other = self.pairs.get(peer, incarnation)
            return [pg.recv([t], other, tag) for t, tag in recvs] + [pg.send([t], other, tag) for t, tag in sends]
        src = self._global(peer)
        rx, tx = self._lane(peer, self.world.rank), self._lane(self.world.rank, peer)
        if self.world.backend == "nccl" and rx is tx and self.stage_device.type != "cpu":
            ops = [dist.P2POp(dist.irecv, t, src, rx, tag) for t, tag in recvs]
            ops += [dist.P2POp(dist.isend, t, src, tx, tag) for t, tag in sends]
            return dist.batch_isend_irecv(ops) if ops else []
        works = [dist.irecv(t, src=src, group=rx, tag=tag) for t, tag in recvs]
        works += [dist.isend(t, dst=src, group=tx, tag=tag) for t, tag in sends]
        return works

    def _start(self, peer: int, header: torch.Tensor, flats: list[torch.Tensor], round_idx: int) -> _Inbox:
        ib = _Inbox(peer, self._incarnation(peer), holds_body=bool(flats))
        base = (round_idx % (1 << 20)) * 1024
        tags = [base + b % HEADER_TAG for b in range(len(flats))]

        def run() -> None:
            pending: list = []
            try:  # posting itself raises once a dead partner has closed the connection
                hdr = torch.empty(HEADER_LEN, dtype=torch.int64, device=header.device)
                works = self._p2p([(hdr, base + HEADER_TAG)], [(header, base + HEADER_TAG)], peer, ib.incarnation)
                works[0].wait()
                pending = works[1:]
                if not flats:  # we skip this round: the partner learnt it from our header
                    ib.status, ib.detail = "skipped", "this rank skips the round"
                    return
                problem = "partner skips this round" if int(hdr[7]) & FLAG_SKIP else header_problem(hdr, header)
                if problem is not None:  # never post a body receive whose size the partner did not agree to
                    ib.status, ib.detail = ("skipped" if int(hdr[7]) & FLAG_SKIP else "rejected"), problem
                    return
                bufs = [torch.empty_like(f) for f in flats]
                works = self._p2p(list(zip(bufs, tags)), list(zip(flats, tags)), peer, ib.incarnation)
                self.stats.bytes_sent += sum(f.numel() * f.element_size() for f in flats)
                for w in works[: len(bufs)]:
                    w.wait()
                pending += works[len(bufs):]
                if int(checksum(bufs)) != int(hdr[6]):
                    ib.status, ib.detail = "corrupt", "body checksum differs from the header's"
                elif not all(bool(torch.isfinite(b).all()) for b in bufs if b.is_floating_point()):
                    ib.status, ib.detail = "nonfinite", "NaN or inf in the partner's tensors"
                else:
                    ib.status, ib.bufs = "ok", bufs
            except RuntimeError as e:  # a dead peer breaks its pair; the run goes on
                ib.status, ib.detail = "failed", (str(e).splitlines() or [type(e).__name__])[0]
            finally:
                ib.received.set()
                for w in pending:  # the send buffers stay alive (in this closure) until the partner took them
                    try:
                        w.wait()
                    except RuntimeError:
                        break

        if self.deadline_s is None and self.world.backend == "nccl" and self.pairs is None:
            run()  # no deadline: NCCL work queues on the stream, no helper thread needed
        else:
            # gloo's p2p works never report is_completed() and a Work.wait(timeout) that
            # expires closes the pair's connection for good, so a helper thread does the
            # blocking waits and the caller gives it until the deadline.
            ib.thread = threading.Thread(target=run, daemon=True, name=f"pair-exchange-{peer}")
            ib.thread.start()
        return ib
