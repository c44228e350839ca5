"""Replacement workers heal from a live NoLoCo peer; live peers serve them between rounds.

A replacement (world.incarnation > 0) asks the live rank furthest along (membership keys) for
its state, through the store, and receives it on their pair group: φ, outer momentum, model
weights, AdamW state, LR schedule, sampler position, step and round counters -- the trainer's
state minus the RNG. The donor notices the request after its next outer step, takes the
snapshot there (a consistent point: θ = φ, inner_count = 0) and sends it from a helper thread,
so serving costs it one serialisation, not a round. A donor that dies or sends something
malformed costs the replacement that attempt; it then asks the next live rank.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from decentrain.core.comm.heal_transfer import decode_state, encode_state, recv_state, send_state
from decentrain.core.comm.membership import Membership
from decentrain.core.comm.pair_groups import PairGroups

log = logging.getLogger(__name__)


def tensors_crc(tensors: list[torch.Tensor]) -> int:
    """CRC32 of the raw bytes of `tensors` (logged by both sides of a heal: equal means identical φ)."""
    crc = 0
    for t in tensors:
        crc = zlib.crc32(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes(), crc)
    return crc


@dataclass
class Healer:
    membership: Membership
    pairs: PairGroups
    get_state: Callable[[], dict[str, Any]]
    load_state: Callable[[dict[str, Any]], None]
    attempt_s: float = 60.0  # per donor: it serves after its next outer step
    _serving: list = field(default_factory=list, repr=False)
    _pending: list = field(default_factory=list, repr=False)  # requests waiting for the snapshot in flight

    # -- donor side ---------------------------------------------------------------------
    def serve(self, phi: list[torch.Tensor]) -> None:
        """Answer the oldest pending heal request with a snapshot taken now (call right after an outer step).

        At most one snapshot is in flight: each holds a copy of the whole state, so a burst of
        requests (forged ones included) waits for the one being sent instead of piling up.
        """
        for req in self.membership.heal_requests():
            if req not in self._pending:
                self._pending.append(req)
        self._serving = [t for t in self._serving if t.is_alive()]
        if self._serving or not self._pending:
            return
        for rank, inc in [self._pending.pop(0)]:
            state = self.get_state()
            skeleton, blob = encode_state(state)
            crc = tensors_crc(phi)
            log.info(
                "serving heal to rank %d (incarnation %d): step %d, round %d, phi crc %08x, %.1f MB",
                rank,
                inc,
                state["step"],
                state["algorithm"]["round"],
                crc,
                len(blob) / 1e6,
            )

            def send(rank=rank, inc=inc, skeleton=skeleton, blob=blob) -> None:
                try:
                    pg, other = self.pairs.get(rank, inc)
                    send_state(pg, other, skeleton, blob)
                except RuntimeError as e:  # the replacement died meanwhile: its loss, not ours
                    log.warning("heal of rank %d failed: %s", rank, (str(e).splitlines() or [""])[0])

            t = threading.Thread(target=send, daemon=True, name=f"heal-serve-{rank}")
            t.start()
            self._serving.append(t)

    def finish(self, timeout_s: float = 60.0) -> None:
        """Let states being served reach their replacements (before the pair groups close)."""
        for t in self._serving:
            t.join(timeout_s)
        self._serving.clear()

    # -- replacement side ---------------------------------------------------------------
    def _donors(self, tried: set[int]) -> list[tuple[int, int]]:
        """(rank, incarnation) of live peers, furthest along first.

        A rank whose published incarnation a launcher has replaced is dead (a whole host lost
        takes several ranks, whose replacements start together): asking it would cost an attempt.
        """
        m = self.membership
        live = [
            (p.done, r, p.incarnation)
            for r in range(m.world_size)
            if r != m.rank
            and r not in tried
            and (p := m.progress(r)) is not None
            and not p.finished
            and not m.replaced(r, p.incarnation)
        ]
        return [(r, inc) for _, r, inc in sorted(live, key=lambda x: (-x[0], x[1]))]

    def heal(self, timeout_s: float) -> tuple[int, float]:
        """Pull and load a live peer's state; returns (donor rank, seconds). RuntimeError if none could serve."""
        like = self.get_state()
        skeleton, blob = encode_state(like)
        limit = 2 * max(len(skeleton), len(blob)) + (1 << 20)  # a peer's state is the size of ours
        start, tried, why = time.perf_counter(), set(), "no live peer published its progress"
        while (left := timeout_s - (time.perf_counter() - start)) > 0:
            m = self.membership
            others = [m.progress(r) for r in range(m.world_size) if r != m.rank]
            if others and all(p is not None and p.finished for p in others):
                raise RuntimeError("no live peer to heal from: every other rank has finished the run")
            donors = self._donors(tried)
            if not donors:
                tried.clear()
                time.sleep(0.5)
                continue
            donor, inc = donors[0]
            got = self._pull(donor, inc, like, limit, min(left, self.attempt_s))
            if isinstance(got, str):
                why = f"rank {donor}: {got}"
                log.warning("heal from rank %d failed (%s); trying another peer", donor, got)
                tried.add(donor)
                continue
            try:
                self.load_state(got)
            except (ValueError, KeyError, RuntimeError, TypeError) as e:
                why = f"rank {donor}: state not loadable ({e})"
                log.warning("heal from rank %d: %s", donor, why)
                tried.add(donor)
                continue
            return donor, time.perf_counter() - start
        raise RuntimeError(f"could not heal from any live peer within {timeout_s:.0f}s (last: {why})")

    def _pull(self, donor: int, inc: int, like: dict, limit: int, timeout_s: float) -> dict | str:
        box: dict[str, Any] = {}

        def receive() -> None:
            try:
                pg, other = self.pairs.get(donor, inc)  # rendezvous: the donor builds its side when it serves
                box["raw"] = recv_state(pg, other, limit)
            except RuntimeError as e:
                box["raw"] = (str(e).splitlines() or ["connection failed"])[0]

        self.membership.request_heal(donor)
        t = threading.Thread(target=receive, daemon=True, name=f"heal-pull-{donor}")
        t.start()
        t.join(timeout_s)
        raw = box.get("raw", f"no answer within {timeout_s:.0f}s")
        return raw if isinstance(raw, str) else decode_state(*raw, like)
