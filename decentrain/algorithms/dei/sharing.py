"""Elites shared at each round's end: a signed, capped payload, published without a barrier.

Inside one job the nodes share through the job's c10d store (it lives in the launcher, not in
any node): a node sets its round-r payload under its own key and returns to work, then reads
each peer's key, waiting at most until the round's deadline. A late or dead peer costs its
elites for that round, never the run. This is the byte all-gather with a deadline: an
all-gather proper would wait forever for a dead member.

A payload is `signature (64 bytes) || JSON body`, signed with the node's Ed25519 key
(`core.identity`). Each node writes its public key once (compare-and-set) at start; a payload
counts only if it verifies under the key of the slot it was read from, so a node cannot speak
for another. The decoder is total and checks sizes before parsing; the elites' text is then
parsed by `redcode.parse` and evaluated by this node (a sender's claimed fitness is not read).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from decentrain.core.identity import NodeIdentity, is_public_key_hex, verify_signature

log = logging.getLogger(__name__)

VERSION = 1
SIGNATURE_BYTES = 64


@dataclass
class ShareConfig:
    elites: int = 4  # elites a node publishes per round (its best, by fitness)
    max_elites_per_peer: int = 4  # elites taken from one peer per round (each costs this node a battle)
    max_chars: int = 8000  # per elite text
    deadline_s: float = 30.0  # how long a node waits for its peers' payloads after publishing its own

    def __post_init__(self) -> None:
        # an archive has 36 cells, and a 100-instruction warrior renders in under 4 kB: the bounds
        # keep a payload (max_payload_bytes) a few hundred kB at most
        for name, high in (("elites", 36), ("max_elites_per_peer", 36), ("max_chars", 65_536)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
                raise ValueError(f"share.{name}={value!r} must be an integer in [0, {high}]")
        if not (isinstance(self.deadline_s, (int, float)) and 0 < self.deadline_s <= 86_400):
            raise ValueError(f"share.deadline_s={self.deadline_s} must be in (0, 86400]")

    @property
    def max_payload_bytes(self) -> int:
        return SIGNATURE_BYTES + 256 + self.max_elites_per_peer * (2 * self.max_chars + 8)


def encode(identity: NodeIdentity, round_: int, elites: list[str]) -> bytes:
    body = json.dumps(
        {"v": VERSION, "node": identity.node_id, "round": round_, "elites": elites},
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode()
    return bytes.fromhex(identity.sign(body).decode()) + body


def decode(data: bytes, cfg: ShareConfig, round_: int, public_key: str, drops: Counter) -> list[str]:
    """The elites' texts in `data`, or [] (counted in `drops` by reason); never raises."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > cfg.max_payload_bytes:
        drops["too_large"] += 1
        return []
    signature, body = bytes(data[:SIGNATURE_BYTES]), bytes(data[SIGNATURE_BYTES:])
    if not verify_signature(public_key, signature.hex().encode(), body):
        drops["bad_signature"] += 1
        return []
    try:
        doc = json.loads(body.decode("ascii"))
    except (ValueError, RecursionError):
        drops["not_json"] += 1
        return []
    if not (
        isinstance(doc, dict)
        and set(doc) == {"v", "node", "round", "elites"}
        and doc["v"] == VERSION
        and doc["node"] == public_key
        and type(doc["round"]) is int
        and isinstance(doc["elites"], list)
    ):
        drops["bad_schema"] += 1
        return []
    if doc["round"] != round_:
        drops["wrong_round"] += 1
        return []
    elites = [e for e in doc["elites"] if isinstance(e, str) and len(e) <= cfg.max_chars]
    if len(elites) != len(doc["elites"]) or len(elites) > cfg.max_elites_per_peer:
        drops["bad_elites"] += 1
        return []
    return elites


class StoreSharing:
    """Publish this node's payload and collect its peers' through the job's store, with a deadline."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        identity: NodeIdentity,
        cfg: ShareConfig,
        run_key: str = "dei",
    ):
        self.store, self.rank, self.world_size, self.cfg = store, rank, world_size, cfg
        self.identity, self.prefix = identity, run_key
        self.drops: Counter[str] = Counter()
        self.keys: dict[int, str] = {}
        # Write-once: the first value set under a slot's key stays; a second writer finds it taken.
        slot = f"{self.prefix}/key/{rank}"
        held = store.compare_set(slot, "", identity.node_id).decode()
        if held != identity.node_id:
            raise RuntimeError(f"{slot} is held by another key: is another job using this run's store?")

    def _peer_key(self, peer: int, deadline: float) -> str | None:
        if peer not in self.keys:
            raw = self._get(f"{self.prefix}/key/{peer}", deadline)
            if raw is None or not is_public_key_hex(raw.decode("ascii", errors="replace")):
                return None
            self.keys[peer] = raw.decode("ascii")
        return self.keys[peer]

    def _get(self, key: str, deadline: float) -> bytes | None:
        left = deadline - time.monotonic()
        if left <= 0 and not self.store.check([key]):
            return None
        try:
            self.store.wait([key], timedelta(seconds=max(left, 0.001)))
            return self.store.get(key)
        except (RuntimeError, dist.DistError):  # timed out, or the store went away
            return None

    def publish(self, round_: int, elites: list[str]) -> None:
        self.store.set(f"{self.prefix}/r{round_}/{self.rank}", encode(self.identity, round_, elites))

    def collect(self, round_: int) -> dict[int, list[str]]:
        """{peer rank: its round-`round_` elites} for the peers heard before the deadline."""
        deadline = time.monotonic() + self.cfg.deadline_s
        out: dict[int, list[str]] = {}
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            key = self._peer_key(peer, deadline)
            data = self._get(f"{self.prefix}/r{round_}/{peer}", deadline) if key else None
            if data is None:
                self.drops["missing"] += 1
                continue
            got = decode(data, self.cfg, round_, key, self.drops)
            if got:
                out[peer] = got
        return out

    def exchange(self, round_: int, elites: list[str]) -> dict[int, list[str]]:
        """Publish `elites` for `round_`, then collect the peers' (a dead peer costs only its own)."""
        self.publish(round_, elites)
        return self.collect(round_)
