"""`Transport` over torch.distributed (gloo or NCCL): what multi-process runs use.

Collectives run on the world's process group. Gossip needs more, set up once by
`start_gossip` at start-up: membership keys and per-pair groups in this job's namespace
of the shared store (`core/comm/membership.job_number`), and the exchange with its wait policy.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from decentrain.core.comm.bytes_comm import GatheredBytes
from decentrain.core.comm.bytes_comm import all_gather_bytes as _all_gather_bytes
from decentrain.core.comm.deadline import ArrivalWindow
from decentrain.core.comm.membership import Membership, job_number
from decentrain.core.comm.pair_exchange import ExchangeStats, PairExchange
from decentrain.core.comm.pair_groups import PairGroups
from decentrain.core.comm.transport import GossipOptions, Transport, Work, all_gather_bytes_sent
from decentrain.core.world import World

RECONNECT_TIMEOUT_S = 5.0  # a reconnect to a store that is gone fails within this (the heartbeat tries again)


def _reconnect(w: World, prefix: str):
    """Opens a fresh connection for the membership: (this job's store, the launcher's store)."""
    if w.store_client is None:
        return None
    client = w.store_client

    def reconnect() -> tuple[dist.Store, dist.Store]:
        shared = client(RECONNECT_TIMEOUT_S)
        return dist.PrefixStore(prefix, shared), shared

    return reconnect


class _Done:
    def wait(self) -> None:
        return None


class TorchTransport(Transport):
    def __init__(self, world: World):
        self.world = world
        self.rank, self.world_size = world.rank, world.world_size
        self.pair_exchange: PairExchange | None = None
        self.membership: Membership | None = None
        self.pairs: PairGroups | None = None
        self._stats = ExchangeStats()

    @property
    def stats(self) -> ExchangeStats:
        return self.pair_exchange.stats if self.pair_exchange is not None else self._stats

    def start_gossip(self, opts: GossipOptions) -> "TorchTransport":
        """Membership, pair groups and the exchange; collective at start-up (every rank calls it)."""
        w = self.world
        ex = PairExchange(w, opts.bucket_bytes, opts.deadline_s, reuse_buffers=opts.reuse_buffers)
        if opts.adaptive is not None and opts.adaptive.enabled and opts.deadline_s is not None:
            ex.arrivals = ArrivalWindow(opts.deadline_s, opts.adaptive)
        if w.store is not None and w.group is None and w.world_size > 1:
            # progress and heartbeat over the job's store: stopped or lagging partners are not waited for
            w.gossip_jobs = job_number(w.store, w.rank, w.incarnation, w.world_size, w.gossip_jobs)
            prefix = f"job{w.gossip_jobs}"
            self.membership = Membership(
                dist.PrefixStore(prefix, w.store),
                w.rank,
                w.world_size,
                w.incarnation,
                launcher_store=w.store,
                reconnect=_reconnect(w, prefix),
            )
            self.membership.start_heartbeat()
            ex.membership, ex.stall_s = self.membership, opts.stall_s
            if w.store_client is not None and (w.backend != "nccl" or opts.deadline_s is not None):
                # host-staged exchanges run on per-pair groups, which a replacement can join
                client = w.store_client
                self.pairs = PairGroups(lambda: dist.PrefixStore(prefix, client()), w.rank, w.incarnation)
                ex.pairs = self.pairs
                if w.incarnation == 0:  # start-up: meet every rank now, except one that dies meanwhile
                    m, stall = self.membership, opts.stall_s
                    gone = (lambda p: m.stopped(p, stall)) if stall is not None else (lambda p: False)
                    self.pairs.connect_all(w.world_size, gone=gone)
        if opts.full_duplex and w.is_distributed and self.pairs is None:
            ex.full_duplex()  # start-up only: creating groups is collective
        ex.check_transport()
        self.pair_exchange = ex
        return self

    # -- gossip ---------------------------------------------------------------------------
    def exchange(self, tensors: Sequence[torch.Tensor], group: tuple[int, ...], round_idx: int):
        assert self.pair_exchange is not None, "start_gossip() first"
        return self.pair_exchange.exchange(tensors, group, round_idx)

    def skip_round(self, group: tuple[int, ...], round_idx: int) -> None:
        assert self.pair_exchange is not None, "start_gossip() first"
        self.pair_exchange.skip_round(group, round_idx)

    def live_round(self) -> int | None:
        return self.membership.live_round() if self.membership is not None else None

    def publish(self, rounds_done: int, finished: bool = False) -> None:
        if self.membership is not None:
            self.membership.publish(rounds_done, finished)

    # -- collectives ----------------------------------------------------------------------
    def all_reduce_sum(self, flat: torch.Tensor) -> Work:
        if not self.world.is_distributed:
            return _Done()
        return dist.all_reduce(flat, group=self.world.group, async_op=True)

    def all_gather(self, t: torch.Tensor) -> tuple[list[torch.Tensor], Work]:
        if not self.world.is_distributed:
            return [t.clone()], _Done()
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        return out, dist.all_gather(out, t, group=self.world.group, async_op=True)

    def all_gather_bytes(self, data: bytes, max_bytes: int = 64 << 20) -> GatheredBytes:
        self.stats.bytes_sent += all_gather_bytes_sent(len(data) + 8, self.world_size)  # + its int64 length
        return _all_gather_bytes(self.world, data, max_bytes)

    def all_reduce_min(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.world.device)
        if self.world.is_distributed:
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.world.group)
        return float(t.item())

    # -- lifetime -------------------------------------------------------------------------
    def finish(self, rounds_done: int) -> None:
        if self.membership is not None:  # partners still running skip this rank at once
            self.membership.publish(rounds_done, finished=True)
            self.membership.stop()

    def close(self) -> None:
        if self.pairs is not None:
            self.pairs.close()
