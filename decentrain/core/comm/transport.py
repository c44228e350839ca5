"""What pre-training algorithms ask of the network: the `Transport` interface.

Three operations cover the families: a pair (group) exchange with a deadline (NoLoCo's
gossip), a collective mean across replicas (DiLoCo, Streaming DiLoCo), and an all-gather
of byte payloads. Implementations: `core/comm/dist_transport.py` over torch.distributed
(gloo/NCCL) and `core/comm/inprocess_transport.py` (N replicas as threads of one process, for tests and
fast benchmarks). Like torchft's `ProcessGroup` seam, an algorithm written against this
class runs unchanged over either.

Means are the caller's business for gossip (the exchange returns the partners' tensors),
and the transport's for collectives (a sum on the wire is what a ring all-reduce is for);
a quantised payload cannot be summed on the wire, so a `MeanCodec` encodes it into parts
that are all-gathered and decoded by every replica, in fp32.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from decentrain.core.comm.bytes_comm import GatheredBytes
from decentrain.core.comm.deadline import AdaptiveDeadlineConfig
from decentrain.core.comm.pair_exchange import ExchangeStats

if TYPE_CHECKING:
    from decentrain.core.comm.membership import Membership
    from decentrain.core.comm.pair_groups import PairGroups


@dataclass
class GossipOptions:
    """How a transport that keeps per-partner state sets up gossip (`Transport.start_gossip`)."""

    bucket_bytes: int = 32 << 20
    deadline_s: float | None = None  # None: wait for a partner forever
    stall_s: float | None = None  # give up on a partner whose heartbeat stopped this long
    full_duplex: bool = True  # one process group per direction (start-up cost O(N²) groups)
    adaptive: AdaptiveDeadlineConfig | None = None  # enabled: deadline_s is the cap of an adaptive deadline
    # pooled wire buffers: an exchange's result is valid until the next exchange (NoLoCo averages it at once)
    reuse_buffers: bool = True


def ring_all_reduce_bytes(nbytes: int, n: int) -> int:
    """What one rank sends in a ring all-reduce of `nbytes` over `n` ranks: 2(n-1)/n of the payload
    (reduce-scatter, then all-gather)."""
    return 2 * (n - 1) * nbytes // n if n > 1 else 0


def all_gather_bytes_sent(nbytes: int, n: int) -> int:
    """What one rank sends in an all-gather of its `nbytes` to `n - 1` others (a ring forwards
    each rank's part n-1 times in total; per rank that is n-1 parts of its size)."""
    return (n - 1) * nbytes if n > 1 else 0


class Work(Protocol):
    def wait(self) -> Any: ...


class MeanCodec(Protocol):
    """How a mean's payload travels when it cannot be summed on the wire (e.g. int4 codes)."""

    def encode(self, flat: torch.Tensor) -> Sequence[torch.Tensor]: ...

    def decode(self, parts: Sequence[torch.Tensor], numel: int) -> torch.Tensor:
        """One replica's parts back to `numel` fp32 values."""
        ...


@dataclass
class PendingMean:
    """An in-flight mean; `result()` waits and returns fp32 tensors shaped like the inputs."""

    works: list
    parts: list[list[torch.Tensor]]  # per wire part, one buffer per replica (a sum: one summed buffer)
    like: list[torch.Tensor]
    codec: MeanCodec | None
    n: int

    @property
    def payload_bytes(self) -> int:
        """What this replica put on the wire: its flat fp32 payload, or its encoded parts."""
        return sum(part[0].numel() * part[0].element_size() for part in self.parts)

    def result(self) -> list[torch.Tensor]:
        for w in self.works:
            w.wait()
        self.works = []
        numel = sum(t.numel() for t in self.like)
        if self.codec is None:
            flat = self.parts[0][0] / self.n
        else:
            flat = torch.zeros(numel, dtype=torch.float32, device=self.like[0].device)
            for peer in range(self.n):
                flat += self.codec.decode([part[peer] for part in self.parts], numel)
            flat /= self.n
        return list(_unflatten_dense_tensors(flat, self.like))


class Transport(ABC):
    """One replica's view of the others (`rank` of `world_size` replicas)."""

    rank: int
    world_size: int
    stats: ExchangeStats  # stats.bytes_sent: every byte this replica put on the wire, any operation
    # what a replacement heals over (noloco/healing.py): live replicas' progress and per-pair groups;
    # None where the transport has neither (replacements cannot join it)
    membership: Membership | None = None
    pairs: PairGroups | None = None

    # -- gossip ---------------------------------------------------------------------------
    def start_gossip(self, opts: GossipOptions) -> "Transport":
        """Set up what pair exchanges need (collective at start-up: every replica calls it); a no-op where
        nothing needs setting up."""
        return self

    @abstractmethod
    def exchange(
        self, tensors: Sequence[torch.Tensor], group: tuple[int, ...], round_idx: int
    ) -> list[list[torch.Tensor]] | None:
        """Send `tensors` to the other members of `group`; their tensors (group order, same shapes and
        dtypes), [] alone, or None when a partner missed the deadline or sent something unusable."""

    @abstractmethod
    def skip_round(self, group: tuple[int, ...], round_idx: int) -> None:
        """Tell `group` this replica skips `round_idx` (nobody waits on it)."""

    def live_round(self) -> int | None:
        """Where the other live replicas are (median rounds done), if the transport knows."""
        return None

    def publish(self, rounds_done: int, finished: bool = False) -> None:
        """Tell the others how far this replica is (membership); a no-op where nobody needs it."""

    # -- collectives ----------------------------------------------------------------------
    @abstractmethod
    def all_reduce_sum(self, flat: torch.Tensor) -> Work:
        """Start summing `flat` in place over all replicas."""

    @abstractmethod
    def all_gather(self, t: torch.Tensor) -> tuple[list[torch.Tensor], Work]:
        """Start gathering every replica's `t` (same shape everywhere) into the returned list."""

    @abstractmethod
    def all_gather_bytes(self, data: bytes, max_bytes: int = 64 << 20) -> GatheredBytes:
        """Every replica's bytes in rank order; oversized announcements are dropped, never allocated."""

    @abstractmethod
    def all_reduce_min(self, value: float) -> float:
        """The smallest `value` over all replicas."""

    def start_mean(self, tensors: Sequence[torch.Tensor], codec: MeanCodec | None = None) -> PendingMean:
        """Start averaging `tensors` over all replicas (async); fp32 accumulation in every mode."""
        n = self.world_size
        flat = _flatten_dense_tensors([t.detach().float() for t in tensors])
        like = [torch.empty(t.shape, dtype=torch.float32, device=flat.device) for t in tensors]
        if codec is None:
            works = [self.all_reduce_sum(flat)] if n > 1 else []
            self.stats.bytes_sent += ring_all_reduce_bytes(flat.numel() * flat.element_size(), n)
            return PendingMean(works, [[flat]], like, None, n)
        parts, works = [], []
        for part in codec.encode(flat):  # one flat payload: chunks may span tensor boundaries
            self.stats.bytes_sent += all_gather_bytes_sent(part.numel() * part.element_size(), n)
            if n > 1:
                gathered, work = self.all_gather(part)
                works.append(work)
            else:
                gathered = [part.clone()]
            parts.append(gathered)
        return PendingMean(works, parts, like, codec, n)

    # -- lifetime -------------------------------------------------------------------------
    def finish(self, rounds_done: int) -> None:
        """This replica is done training: partners still running stop waiting for it."""

    def close(self) -> None:
        """Release connections (after `finish` and after any state still being served)."""
