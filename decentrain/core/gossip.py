"""Gossip pairing and the pairwise exchange of flat buffers.

Pairing needs no messages: every rank derives the same random perfect matching for
round t from a shared seed. The exchange then moves bucketed flat buffers between
the members of a group with async send/recv and an optional deadline.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import torch
import torch.distributed as dist

from decentrain.core.world import World

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
    timeouts: int = 0
    failures: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0


@dataclass
class PairExchange:
    """Average tensors with the other members of this rank's group.

    `deadline_s`: a partner that has not delivered within it costs this round's averaging
    (the call returns None), never the run. Late buffers are kept alive until the
    process ends, because gloo still writes into them; a per-round tag keeps a late
    message from matching a later round.

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
    _orphans: list = field(default_factory=list, repr=False)
    _lanes: dict = field(default_factory=dict, repr=False)  # (src, dst) -> process group

    def full_duplex(self, max_world: int = 64) -> "PairExchange":
        """Create one process group per direction of every rank pair (N·(N−1) groups)."""
        n = self.world.world_size
        if n > max_world:  # O(N²) groups: beyond this, exchange on the shared group
            return self
        if self.world.group is not None:
            # a sub-world (replicas × shards): new_group must be entered by every rank of the
            # default group in the same order, which the other sub-worlds don't do here
            return self
        ranks = list(range(n))
        for i in range(n):
            for j in range(i + 1, n):
                a, b = ranks[i], ranks[j]
                # every rank creates every group, in the same order (new_group is collective)
                self._lanes[(a, b)] = dist.new_group([a, b])
                self._lanes[(b, a)] = dist.new_group([a, b])
        return self

    def _global(self, rank: int) -> int:
        # p2p takes global ranks; a sub-world's ranks are indices into its group
        return rank if self.world.group is None else dist.get_global_rank(self.world.group, rank)

    def _lane(self, src: int, dst: int):
        return self._lanes.get((src, dst), self.world.group)

    def average(self, tensors: Sequence[torch.Tensor], group: tuple[int, ...], round_idx: int) -> list[torch.Tensor] | None:
        """Return the group mean of each tensor (a new list), or None if the deadline passed."""
        peers = [p for p in group if p != self.world.rank]
        if not peers:
            return [t.clone() for t in tensors]
        start = time.perf_counter()
        self.stats.rounds += 1
        mine = [t.detach().contiguous() for t in tensors]
        works, inbox = [], []
        for b, idx in enumerate(flatten_buckets(mine, self.bucket_bytes)):
            if len(idx) > 1:
                flat = torch.cat([mine[i].reshape(-1) for i in idx])
            else:  # no copy, unless a deadline may leave the send running after we return
                flat = mine[idx[0]].reshape(-1)
                flat = flat.clone() if self.deadline_s is not None else flat
            tag = (round_idx % (1 << 20)) * 1024 + b % 1024
            for p in peers:
                # post the receive before the send so both directions can progress at once
                buf = torch.empty_like(flat)
                works.append(dist.irecv(buf, src=self._global(p), group=self._lane(p, self.world.rank), tag=tag))
                works.append(dist.isend(flat, dst=self._global(p), group=self._lane(self.world.rank, p), tag=tag))
                inbox.append((idx, buf))
                self.stats.bytes_sent += flat.numel() * flat.element_size()
        if not self._wait(works, start):
            self._orphans.append((works, inbox, mine))
            self.stats.seconds += time.perf_counter() - start
            return None
        sums = [t.float() for t in mine]  # may alias the caller's fp32 tensors: add out of place
        for idx, buf in inbox:
            offset = 0
            for i in idx:
                n = mine[i].numel()
                sums[i] = sums[i] + buf[offset : offset + n].view_as(mine[i]).float()
                offset += n
        self.stats.seconds += time.perf_counter() - start
        return [s.div_(len(group)).to(t.dtype) for s, t in zip(sums, mine)]

    def _wait(self, works: list, start: float) -> bool:
        # gloo's p2p works never report is_completed() and a Work.wait(timeout) that
        # expires closes the pair's connection for good, so a helper thread does the
        # blocking wait and we give it until the deadline.
        failed: list[BaseException] = []

        def wait_all() -> None:
            try:
                for w in works:
                    w.wait()
            except RuntimeError as e:  # a dead peer breaks its pair; the run goes on
                failed.append(e)

        if self.deadline_s is None:
            wait_all()
        else:
            waiter = threading.Thread(target=wait_all, daemon=True, name="pair-exchange-wait")
            waiter.start()
            waiter.join(max(0.0, self.deadline_s - (time.perf_counter() - start)))
            if waiter.is_alive():
                self.stats.timeouts += 1
                return False
        if failed:
            self.stats.failures += 1
            return False
        return True
