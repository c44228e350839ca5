"""Which listed peers a node reads each round, so that a handful of fresh keys cannot crowd out
the peers that have been sending valid payloads.

Registry entries are free to make (a key each), so the registry is no ranking. Each round half
of the read slots go to peers drawn at random with weight = their recent valid contributions
(decayed per round), and the rest to the listed peers read least recently (never-read first,
ties at random): every listed peer is read at least once every ceil(listed / explore slots)
rounds, and a new honest peer earns merit on its first valid payload. When the known-peer table
is full, peers without merit are forgotten first, stalest first. Hand-written: no library
schedules reads over an untrusted registry.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Hashable

import numpy as np

MERIT_DECAY = 0.9  # per round: ~10 rounds of memory


class PeerSelector:
    def __init__(self, max_peers_per_round: int, max_known: int, seed: int = 0):
        self.max_peers, self.max_known = max_peers_per_round, max_known
        self.known: OrderedDict[Hashable, float] = OrderedDict()  # peer -> when last listed
        self.merit: dict[Hashable, float] = {}  # decayed count of valid payloads
        self.last_read: dict[Hashable, int] = {}
        self.rng = np.random.default_rng(seed)

    def listed(self, peer: Hashable, now: float) -> None:
        self.known[peer] = now
        self.known.move_to_end(peer)

    def forget(self, now: float, max_age_s: float) -> list[Hashable]:
        """Drop peers not listed within `max_age_s`, then, over `max_known`, those without merit first."""
        gone = [p for p, t in self.known.items() if t < now - max_age_s]
        over = len(self.known) - len(gone) - self.max_known
        if over > 0:
            rest = [p for p in self.known if p not in set(gone)]
            rest.sort(key=lambda p: (self.merit.get(p, 0.0) > 0, self.known[p]))  # no merit, stalest first
            gone += rest[:over]
        for p in gone:
            self.known.pop(p, None)
            self.merit.pop(p, None)
            self.last_read.pop(p, None)
        return gone

    def choose(self, round_: int, exclude: set, room: int | None = None) -> tuple[list, list]:
        """(peers by merit, peers to explore) for this poll; together at most `room` of them."""
        room = self.max_peers - len(exclude) if room is None else room
        candidates = [p for p in self.known if p not in exclude]
        if room <= 0 or not candidates:
            return [], []
        worthy = [p for p in candidates if self.merit.get(p, 0.0) > 0]
        k = min(len(worthy), max(room // 2, 1) if len(candidates) > room else room)
        trusted: list = []
        if k:
            w = np.array([self.merit[p] for p in worthy])
            picked = self.rng.choice(len(worthy), size=k, replace=False, p=w / w.sum())
            trusted = [worthy[int(i)] for i in picked]
        chosen = set(trusted)
        rest = [p for p in candidates if p not in chosen]
        order = self.rng.permutation(len(rest))  # random tie-break among equally old reads
        rest = [rest[int(i)] for i in order]
        rest.sort(key=lambda p: self.last_read.get(p, -math.inf))
        explore = rest[: room - len(trusted)]
        for p in trusted + explore:
            self.last_read[p] = round_
        return trusted, explore

    def contributed(self, peer: Hashable) -> None:
        self.merit[peer] = self.merit.get(peer, 0.0) + 1.0

    def end_round(self) -> None:
        for p in list(self.merit):
            self.merit[p] *= MERIT_DECAY
            if self.merit[p] < 1e-3:
                del self.merit[p]
