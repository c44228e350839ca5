"""Model-sized wire buffers reused across gossip rounds instead of allocated per round.

Measured on loopback (benchmarks/comm_sync, `pair` rows): a fresh 100 MB CPU tensor costs
~200 ms before its first use (the allocator maps new pages for every large tensor and the
kernel faults each 4 KB page in on first touch), against ~30 ms to copy into a warm one.
A pair exchange allocated three such buffers a round (the send staging copy, the receive
buffers and the caller's mean), which made it ~4x a gloo ring all-reduce of the same
bytes; a ring reduces in place and never pays it. So the exchange keeps its buffers here.

A buffer is handed out by `take` and comes back by `give` only when nothing can still
read or write it: a send buffer once its send completed, a receive buffer once the
caller's lease ended (the next exchange). A buffer whose transfer failed or is still in
flight is never given back (the garbage collector frees it once the transfer lets go),
so a late write by a slow partner cannot land in a buffer another round uses.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch

KEEP = 4  # spare buffers kept per (numel, dtype, device): a round's send + receive, and one late round's


class BufferPool:
    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._free: dict[tuple, list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()  # sends give back from the exchange's helper threads
        self.allocated = 0  # buffers created (a warm pool stops creating them)

    @staticmethod
    def _key(numel: int, dtype: torch.dtype, device: torch.device) -> tuple:
        return numel, dtype, torch.device(device)

    def take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A flat contiguous tensor of `numel` `dtype` on `device`, uninitialised (reused when one is free)."""
        with self._lock:
            free = self._free.get(self._key(numel, dtype, device))
            if free:
                return free.pop()
            self.allocated += 1
        return torch.empty(numel, dtype=dtype, device=device)

    def take_like(self, t: torch.Tensor) -> torch.Tensor:
        return self.take(t.numel(), t.dtype, t.device)

    def give(self, bufs) -> None:
        """Return buffers nobody reads or writes any more (beyond `keep` per shape, they are dropped)."""
        with self._lock:
            for b in bufs:
                free = self._free[self._key(b.numel(), b.dtype, b.device)]
                if len(free) < self.keep and all(b is not f for f in free):
                    free.append(b)
