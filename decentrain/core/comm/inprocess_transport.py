"""`Transport` for N replicas in one process (one thread per replica): tests and fast benchmarks.

Replicas hand each other tensors through a shared `InProcessHub`: gossip through mailboxes
keyed (round, sender, receiver), collectives through slots keyed by each replica's call
count (every replica makes the same collective calls in the same order, as with
torch.distributed). Sums run in rank order; with two replicas that is bit-identical to a
gloo all-reduce, with more it may differ from gloo's ring order in the last bit. Nothing
is serialised: a peer here is this process, so the wire checks of `core/comm/wire.py` are not
exercised (the dist tests do that).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import torch

from decentrain.core.comm.bytes_comm import GatheredBytes, PayloadTooLarge, accepted_lengths
from decentrain.core.comm.pair_exchange import ExchangeStats
from decentrain.core.comm.transport import Transport, Work, all_gather_bytes_sent

_SKIP = object()  # what a replica that skips a round leaves in its partners' mailboxes


class InProcessHub:
    """What the replicas of one process share; `transport(rank)` is replica `rank`'s view."""

    def __init__(self, world_size: int, deadline_s: float | None = None, timeout_s: float = 600.0):
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        self.world_size, self.deadline_s, self.timeout_s = world_size, deadline_s, timeout_s
        self._cond = threading.Condition()
        self._mail: dict[tuple[int, int, int], Any] = {}
        self._slots: dict[int, list] = {}  # call index -> [payload per rank, readers so far]
        self._error: BaseException | None = None

    def transport(self, rank: int) -> "InProcessTransport":
        return InProcessTransport(self, rank)

    def abort(self, error: BaseException) -> None:
        """A replica failed: wake every other replica waiting on it (they raise instead of hanging)."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"another in-process replica failed: {self._error!r}")

    # -- mailboxes (gossip) ---------------------------------------------------------------
    def post(self, key: tuple[int, int, int], value: Any) -> None:
        with self._cond:
            self._mail[key] = value
            self._cond.notify_all()

    def take(self, key: tuple[int, int, int], timeout_s: float | None) -> Any | None:
        """The value posted under `key` (removed), or None if none came within `timeout_s`."""
        now = time.monotonic()
        deadline, hard = (None if timeout_s is None else now + timeout_s), now + self.timeout_s
        with self._cond:
            while key not in self._mail:
                self._check()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None
                if now >= hard:
                    raise TimeoutError(f"in-process exchange {key} waited {self.timeout_s:.0f}s")
                self._cond.wait(min(1.0, (hard if deadline is None else deadline) - now))
            return self._mail.pop(key)

    # -- collective slots -----------------------------------------------------------------
    def put(self, call: int, rank: int, payload: Any) -> None:
        with self._cond:
            slot = self._slots.setdefault(call, [{}, 0])
            slot[0][rank] = payload
            self._cond.notify_all()

    def collect(self, call: int) -> list[Any]:
        """Every replica's payload of collective `call`, in rank order (waits for all)."""
        end = time.monotonic() + self.timeout_s
        with self._cond:
            while len(self._slots[call][0]) < self.world_size:
                self._check()
                if not self._cond.wait(min(1.0, end - time.monotonic())) and time.monotonic() >= end:
                    raise TimeoutError(f"in-process collective {call} waited {self.timeout_s:.0f}s")
            slot = self._slots[call]
            items = [slot[0][r] for r in range(self.world_size)]
            slot[1] += 1
            if slot[1] == self.world_size:
                del self._slots[call]
            return items


class _Deferred:
    """A collective's work: completes (once) when waited on."""

    def __init__(self, finish: Callable[[], None]):
        self._finish: Callable[[], None] | None = finish

    def wait(self) -> None:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()


class InProcessTransport(Transport):
    def __init__(self, hub: InProcessHub, rank: int):
        if not 0 <= rank < hub.world_size:
            raise ValueError(f"rank={rank} is outside 0..{hub.world_size - 1}")
        self.hub, self.rank, self.world_size = hub, rank, hub.world_size
        self.stats = ExchangeStats()
        self._calls = 0

    # -- gossip ---------------------------------------------------------------------------
    def exchange(self, tensors: Sequence[torch.Tensor], group: tuple[int, ...], round_idx: int):
        peers = [p for p in group if p != self.rank]
        if not peers:
            return []
        start = time.perf_counter()
        self.stats.rounds += 1
        mine = [t.detach().clone() for t in tensors]  # the partner reads them after we moved on
        for p in peers:
            self.hub.post((round_idx, self.rank, p), mine)
        self.stats.bytes_sent += len(peers) * sum(t.numel() * t.element_size() for t in mine)
        got, ok = [], True
        for p in peers:
            left = (
                None if self.hub.deadline_s is None else max(0.0, self.hub.deadline_s - (time.perf_counter() - start))
            )
            value = self.hub.take((round_idx, p, self.rank), left)
            if value is None:
                self.stats.timeouts += 1
                ok = False
            elif value is _SKIP:
                self.stats.skipped += 1
                ok = False
            else:
                got.append([t.to(m.device) for t, m in zip(value, mine, strict=True)])
        self.stats.seconds += time.perf_counter() - start
        return got if ok else None

    def skip_round(self, group: tuple[int, ...], round_idx: int) -> None:
        for p in group:
            if p != self.rank:
                self.hub.post((round_idx, self.rank, p), _SKIP)

    # -- collectives ----------------------------------------------------------------------
    def _post(self, payload: Any) -> int:
        call, self._calls = self._calls, self._calls + 1
        self.hub.put(call, self.rank, payload)
        return call

    def all_reduce_sum(self, flat: torch.Tensor) -> Work:
        call = self._post(flat.clone())

        def finish() -> None:
            items = self.hub.collect(call)
            total = items[0].clone()
            for x in items[1:]:  # rank order
                total += x.to(total.device)
            flat.copy_(total)

        return _Deferred(finish)

    def all_gather(self, t: torch.Tensor) -> tuple[list[torch.Tensor], Work]:
        call = self._post(t.clone())
        out = [torch.empty_like(t) for _ in range(self.world_size)]

        def finish() -> None:
            for dst, src in zip(out, self.hub.collect(call)):
                dst.copy_(src)

        return out, _Deferred(finish)

    def all_gather_bytes(self, data: bytes, max_bytes: int = 64 << 20) -> GatheredBytes:
        oversized = len(data) > max_bytes
        # + its int64 length, as over gloo
        self.stats.bytes_sent += all_gather_bytes_sent(len(data) + 8, self.world_size)
        items = self.hub.collect(self._post(b"" if oversized else bytes(data)))
        lengths, dropped = accepted_lengths([len(b) for b in items], max_bytes)
        out = GatheredBytes([b if n else b"" for b, n in zip(items, lengths)], dropped)
        if oversized:
            raise PayloadTooLarge(f"payload exceeds max_bytes={max_bytes}; contributed nothing this round")
        return out

    def all_reduce_min(self, value: float) -> float:
        return min(self.hub.collect(self._post(float(value))))
