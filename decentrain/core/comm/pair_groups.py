"""Two-rank gloo process groups, one per pair of incarnations, made over the shared store.

A world-wide gloo group cannot take a new member, so a replacement for a dead worker could
never talk to the survivors through it. Instead every pair of ranks that exchanges builds its
own `ProcessGroupGloo` of size 2 on demand, from a `PrefixStore("pair/<a>-<b>/<inc_a>-<inc_b>")`
of the job's store (a < b). When a partner is replaced, its incarnation (read from the
membership keys) changes, and so does the prefix: the next exchange builds a fresh group with
the newcomer. This is how torchft reconfigures its process groups on a new quorum (a fresh
backend on a store prefix per quorum id, `torchft.process_group.ProcessGroupGloo.configure`);
torchft's version takes a store address and a Manager's quorum, ours takes the store object
World already holds and the incarnations the membership publishes, so it is a few lines here.

Creating a group is a rendezvous of both ranks: it blocks until the partner builds its side
(or `timeout_s`), so callers create groups from helper threads, never on the training thread.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

log = logging.getLogger(__name__)


class PairGroups:
    """`get(peer, peer_incarnation)` -> (2-rank gloo group, the peer's rank in it)."""

    def __init__(self, connect: Callable[[], dist.Store], rank: int, incarnation: int, timeout_s: float = 600.0):
        # `connect` opens a client of the job's store per group: the rendezvous blocks on its
        # client, and a shared one would stall the membership reads of the training thread
        self.connect, self.rank, self.incarnation, self.timeout_s = connect, rank, incarnation, timeout_s
        self._groups: dict[tuple[int, int], dist.ProcessGroupGloo] = {}
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._guard = threading.Lock()

    def prefix(self, peer: int, peer_incarnation: int) -> str:
        (a, ia), (b, ib) = sorted([(self.rank, self.incarnation), (peer, peer_incarnation)])
        return f"pair/{a}-{b}/{ia}-{ib}"

    def get(self, peer: int, peer_incarnation: int) -> tuple[dist.ProcessGroupGloo, int]:
        key = (peer, peer_incarnation)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one rendezvous per pair: concurrent exchanges with the same partner share it
            if key not in self._groups:
                store = dist.PrefixStore(self.prefix(peer, peer_incarnation), self.connect())
                self._groups[key] = dist.ProcessGroupGloo(
                    store, int(self.rank > peer), 2, timedelta(seconds=self.timeout_s)
                )
        return self._groups[key], int(peer > self.rank)

    def connect_all(
        self, world_size: int, gone: Callable[[int], bool] = lambda peer: False, poll_s: float = 0.25
    ) -> "PairGroups":
        """Build this rank's group with every other rank now (start-up, every rank of incarnation 0).

        One thread per peer: distinct pairs meet on distinct prefixes, so building them at once
        cannot deadlock. Returns once every group is built or its peer is `gone` (a rank that
        died during start-up: waiting on its rendezvous held the survivors for `timeout_s` and
        then killed them). A gone peer's rendezvous is left to time out in its thread; nothing
        waits on it again, since its replacement has a new incarnation and so a new prefix.
        Later, only a replacement's groups are built, on demand.
        """
        threads = {
            peer: threading.Thread(target=self._connect, args=(peer,), daemon=True, name=f"pair-group-{peer}")
            for peer in range(world_size)
            if peer != self.rank
        }
        for t in threads.values():
            t.start()
        waiting = set(threads)
        while waiting:
            waiting = {p for p in waiting if threads[p].is_alive() and not gone(p)}
            if waiting:
                threads[min(waiting)].join(poll_s)
        return self

    def _connect(self, peer: int) -> None:
        try:
            self.get(peer, 0)
        except RuntimeError as e:  # the rendezvous timed out: the peer died before meeting this rank
            log.warning(
                "rank %d: no pair group with rank %d at start-up (%s); its rounds are skipped until a "
                "replacement joins",
                self.rank,
                peer,
                str(e).splitlines()[0][:200],
            )

    def close(self) -> None:
        """Abort every group: a receive still pending on one (a partner that never delivered) would
        otherwise make the interpreter's exit terminate the process (SIGABRT)."""
        with self._guard:
            groups, self._groups = list(self._groups.values()), {}
        for pg in groups:
            try:
                pg.abort()
            except RuntimeError:
                pass
