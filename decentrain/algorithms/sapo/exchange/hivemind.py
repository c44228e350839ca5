"""`exchange.name: hivemind`: per-node DHT keys, no barrier between nodes (needs the `swarm` extra).

Each peer's latest record lives under that peer's own signed key and expires after a capped TTL; a
node takes whatever new records have arrived. What a node lets into, and takes out of, a DHT shared
with strangers (key layout, record shapes, size and TTL caps, slow replicas): `dht_guard`. Which
peers' keys it reads each round: `peer_selection`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter, OrderedDict
from functools import partial
from pathlib import Path
from typing import Callable

import hivemind
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from decentrain.algorithms.sapo.dht_guard import (
    CHUNK_BYTES,
    SwarmRecordValidator,
    chunk_subkey,
    compress,
    guard_slow_peers,
    inflate,
    max_chunks,
    owner_digest,
    owner_of,
    registry_key,
    rollouts_key,
    slow_charges,
)
from decentrain.algorithms.sapo.exchange.base import PeerRecord
from decentrain.algorithms.sapo.exchange.config import ExchangeConfig, HivemindConfig
from decentrain.algorithms.sapo.peer_selection import PeerSelector
from decentrain.core.world import World

__all__ = ["ExchangeConfig", "HivemindConfig", "HivemindExchange"]

logger = logging.getLogger(__name__)
_FAILED = object()  # a DHT call that raised or timed out (None is a real answer: nothing stored)
REGISTRY_FULL_READ = 8  # every 8th registry read waits for all replicas (see _refresh_peers)


def _read_peers(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _append_peers(path: Path, maddrs: list[str]) -> None:
    # O_APPEND writes of a few hundred bytes land whole, so concurrent joiners do not interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(f"{m}\n" for m in maddrs).encode())
    finally:
        os.close(fd)


class HivemindExchange:
    """Per-node DHT keys (layout and record rules: `dht_guard`); no barrier between nodes. Built by its
    registry entry, `exchange.HivemindEntry` (has peers, joins no process group).

    Each round a node signs and stores its compressed record under its own key and refreshes
    its registry entry, reads the registry, then polls up to `max_peers_per_round` peers' keys
    for at most `wait_s`. Each peer yields at most one record per round (the rate limit), only
    with a round above the last one taken from it (its high-water mark: replays and round
    rollbacks are dropped), only within the round's byte budget, and only if it inflates within
    `exchange.max_bytes`; byte-identical payloads already taken (a replay under another key) are
    dropped too. Drops are counted in `self.drops` and logged once per round.
    """

    _DIGESTS = 4096  # payload digests remembered for replay detection

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        self.cfg, self.hcfg, self.node_id = cfg, cfg.hivemind, node_id
        # A fresh key per exchange (not hivemind's process-wide one): two nodes in one process stay two owners.
        signer = RSASignatureValidator(RSAPrivateKey())
        self.marker = signer.local_public_key
        self.registry = registry_key(self.hcfg.prefix)
        self.own_key = rollouts_key(self.hcfg.prefix, self.marker)
        self.peers = PeerSelector(
            self.hcfg.max_peers_per_round,
            self.hcfg.max_known_peers,
            seed=int.from_bytes(hashlib.sha256(self.marker).digest()[:4], "little"),
        )
        self.high_water: dict[bytes, int] = {}  # peer marker -> highest round taken from it
        self.digests: OrderedDict[bytes, None] = OrderedDict()
        self.drops: Counter[str] = Counter()
        self.starved_rounds = 0
        self.registry_reads = 0
        self.expirations: dict[bytes, float] = {}  # peer marker -> expiration of the record last taken
        peers = list(self.hcfg.initial_peers)
        peers_file = Path(self.hcfg.peers_file) if self.hcfg.peers_file else None
        if peers_file is not None:
            peers += _read_peers(peers_file)
        self.dht = hivemind.DHT(
            initial_peers=peers or None,
            start=True,
            host_maddrs=self.hcfg.host_maddrs,
            announce_maddrs=self.hcfg.announce_maddrs or None,
            nat_port_map=self.hcfg.nat_port_map,
            use_relay=self.hcfg.use_relay,
            use_auto_relay=self.hcfg.use_auto_relay,
            auto_nat=self.hcfg.auto_nat,
            wait_timeout=self.hcfg.rpc_wait_s,
            blacklist_time=self.hcfg.slow_ban_s,
            record_validators=[
                signer,
                SwarmRecordValidator(self.hcfg.prefix, self.hcfg.max_ttl_s, self.hcfg.max_record_bytes),
            ],
        )
        self.dht.run_coroutine(partial(guard_slow_peers, slow_rpc_s=self.hcfg.slow_rpc_s))
        self.maddrs = [str(m) for m in self.dht.get_visible_maddrs()]
        if peers_file is not None:
            _append_peers(peers_file, self.maddrs)
        logger.info("hivemind node %s at %s (joined via %d peers)", node_id, self.maddrs, len(peers))

    # -- peers -----------------------------------------------------------------------------------

    def _refresh_peers(self) -> None:
        # Any unexpired registry copy ends the search (the first replica's, often our own), so it
        # waits on no slower replica; peers accumulate in `self.peers` over rounds, and every
        # REGISTRY_FULL_READ-th read asks every replica (latest=True) for newcomers the others lack.
        latest = self.registry_reads % REGISTRY_FULL_READ == 0
        self.registry_reads += 1
        found = self._result(self.dht.get(self.registry, latest=latest, return_future=True), "registry_lookup_failed")
        if found is _FAILED:
            return  # keep the last good peer list: a failed lookup is no news of anyone leaving
        now = time.monotonic()
        listed = getattr(found, "value", None)  # None: nothing listed yet
        if isinstance(listed, dict):
            for subkey in listed:
                marker = owner_of(subkey) if isinstance(subkey, bytes) else None
                if marker is None or marker != subkey:
                    self.drops["bad_registry_entry"] += 1
                    continue
                if marker != self.marker:
                    self.peers.listed(marker, now)
        for old in self.peers.forget(now, self.hcfg.max_ttl_s):
            self.high_water.pop(old, None)
            self.expirations.pop(old, None)

    @property
    def known(self) -> OrderedDict[bytes, float]:
        return self.peers.known

    # -- records ---------------------------------------------------------------------------------

    def _assemble(self, marker: bytes, found) -> tuple[int, bytes] | None | str:
        """(round, compressed bytes) of a peer's newest complete payload; None: nothing (yet); str: a drop reason."""
        if found is None or not isinstance(found.value, dict):
            return None  # nothing published yet, or expired
        first = getattr(found.value.get(chunk_subkey(marker, 0)), "value", None)
        if not isinstance(first, dict):
            return "bad_shape" if first is not None else None
        round_, n = first.get("round"), first.get("n")
        if any(not isinstance(v, int) or isinstance(v, bool) for v in (round_, n)):
            return "bad_shape"
        if not 1 <= n <= max_chunks(self.hcfg.max_record_bytes):
            return "bad_shape"
        parts = []
        for i in range(n):
            chunk = first if i == 0 else getattr(found.value.get(chunk_subkey(marker, i)), "value", None)
            if not isinstance(chunk, dict) or chunk.get("round") != round_ or chunk.get("n") != n:
                return None  # the rest of this round's chunks have not landed yet
            if not isinstance(chunk.get("payload"), bytes):
                return "bad_shape"
            parts.append(chunk["payload"])
        return round_, b"".join(parts)

    def _take(
        self, marker: bytes, found, budget: list[int], is_valid: Callable[[PeerRecord], bool] | None
    ) -> PeerRecord | None:
        """One peer's record if it passes every receive-side rule; else counts why and returns None."""
        got = self._assemble(marker, found)
        if got is None or isinstance(got, str):
            if got:
                self.drops[got] += 1
            return None
        round_, data = got
        last = self.high_water.get(marker)
        if last is not None and round_ <= last:
            if round_ < last:
                self.drops["stale_round"] += 1
            return None  # round_ == last: already taken
        if len(data) > budget[0]:
            self.drops["fetch_budget"] += 1
            return None
        budget[0] -= len(data)
        self.high_water[marker] = round_  # one record per peer per round: the rate limit
        self.expirations[marker] = getattr(found, "expiration_time", 0.0)  # the next lookup wants a newer one
        payload = inflate(data, self.cfg.max_bytes)
        if payload is None:
            self.drops["bad_compression"] += 1
            return None
        if not self._remember(payload):
            self.drops["replay"] += 1
            return None
        record = PeerRecord(f"{owner_digest(marker)[:12]}@{round_}", payload, round_)
        if is_valid is not None and not is_valid(record):
            self.drops["invalid_payload"] += 1
            return None  # neither merit nor a place towards min_peers
        return record

    def _newer_than(self, marker: bytes) -> float | None:
        """The expiration a peer's next record must beat (None: any unexpired one, hivemind's default)."""
        last = self.expirations.get(marker)
        return None if last is None else last + 1e-3

    def _remember(self, payload: bytes) -> bool:
        """False if these exact bytes were seen before (taken from a peer, or our own)."""
        digest = hashlib.sha256(payload).digest()
        if digest in self.digests:
            return False
        self.digests[digest] = None
        if len(self.digests) > self._DIGESTS:
            self.digests.popitem(last=False)
        return True

    def _collect(
        self,
        round_: int,
        taken: set[bytes],
        budgets: tuple[list[int], list[int]],
        is_valid: Callable[[PeerRecord], bool] | None,
        ends_wait: Callable[[PeerRecord], bool],
    ) -> tuple[list[PeerRecord], int]:
        """This poll's new records, and how many of them end the wait (each also earns its peer read priority)."""
        trusted, explore = self.peers.choose(round_, taken)
        if (left := len(self.known) - len(taken) - len(trusted) - len(explore)) > 0:
            self.drops["peer_budget"] += left
        peers = trusted + explore
        # The first replica holding a record newer than the one last taken from that peer ends
        # the search (no waiting on slower replicas); never taken: any unexpired record does.
        futures = [
            self.dht.get(
                rollouts_key(self.hcfg.prefix, m),
                latest=False,
                return_future=True,
                sufficient_expiration_time=self._newer_than(m),
            )
            for m in peers
        ]
        deadline = time.monotonic() + self.hcfg.rpc_timeout_s  # the lookups run together: one deadline for all
        out, counted = [], 0
        for k, (marker, future) in enumerate(zip(peers, futures)):
            # Peers with merit spend the shared byte budget first; the explored ones at most half of it.
            budget = budgets[0] if k < len(trusted) else budgets[1]
            left_before = budget[0]
            found = self._result(future, "lookup_error", deadline)
            if found is _FAILED:  # a failed or hung lookup costs this peer's record, not the round
                continue
            record = self._take(marker, found, budget, is_valid)
            if budget is budgets[1]:  # explored bytes count against the shared budget too
                budgets[0][0] = max(budgets[0][0] - (left_before - budget[0]), 0)
            if record is not None:
                taken.add(marker)
                out.append(record)
                if ends_wait(record):  # read priority for what the caller values, not any valid record
                    self.peers.contributed(marker)
                    counted += 1
        return out, counted

    @property
    def _explore_cap(self) -> int:
        return self.hcfg.max_fetch_bytes // 2

    def exchange(
        self,
        round_: int,
        payload: bytes,
        is_valid: Callable[[PeerRecord], bool] | None = None,
        ends_wait: Callable[[PeerRecord], bool] | None = None,
    ) -> list[PeerRecord]:
        """Publish, then poll for records until `min_peers` of them pass `is_valid` and `ends_wait`
        (or `wait_s` ends)."""
        before = sum(self.drops.values()), dict(self.drops)
        data = compress(payload)
        self._remember(payload)  # our own payload coming back under another key is a replay
        if len(payload) > self.cfg.max_bytes or len(data) > self.hcfg.max_record_bytes:
            logger.warning(
                "round %d: own payload of %d bytes (%d compressed) exceeds exchange.max_bytes=%d or "
                "exchange.hivemind.max_record_bytes=%d; not published",
                round_,
                len(payload),
                len(data),
                self.cfg.max_bytes,
                self.hcfg.max_record_bytes,
            )
        else:
            self._publish(round_, data)
        # No barrier: poll briefly for new records, then go on with whatever arrived.
        taken: set[bytes] = set()
        budgets = ([self.hcfg.max_fetch_bytes], [self._explore_cap])
        deadline = time.monotonic() + self.hcfg.wait_s
        self._refresh_peers()
        ends_wait = ends_wait or (lambda record: True)
        out, counted = self._collect(round_, taken, budgets, is_valid, ends_wait)
        while counted < self.hcfg.min_peers and time.monotonic() < deadline:
            time.sleep(self.hcfg.poll_s)
            self._refresh_peers()  # peers that joined meanwhile
            more, more_counted = self._collect(round_, taken, budgets, is_valid, ends_wait)
            out += more
            counted += more_counted
        self.peers.end_round()
        self._count_slow_peers()
        self._report(round_, out, before)
        return out

    def _publish(self, round_: int, data: bytes) -> None:
        chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        expiration = get_dht_time() + self.hcfg.ttl_s
        # One after another, chunk 0 last: a reader that sees this round's chunk 0 finds the rest.
        # Each store returns at its first replica (hivemind goes on storing the rest in the
        # background), so a slow replica delays no publication.
        early = dict(return_future=True, await_all_replicas=False, await_all_tasks=False)
        for i in reversed(range(len(chunks))):
            value = {"round": round_, "n": len(chunks), "payload": chunks[i]}
            stored = self.dht.store(
                self.own_key, value, expiration_time=expiration, subkey=chunk_subkey(self.marker, i), **early
            )
            if self._result(stored, "own_publish_failed") is _FAILED:
                return  # without this chunk the rest is useless to readers: skip this round's publication
        self._result(
            self.dht.store(self.registry, 1, expiration_time=expiration, subkey=self.marker, **early),
            "own_publish_failed",
        )

    def _count_slow_peers(self) -> None:
        """Peers charged as slow in the DHT process since the last round: counted as drops."""
        charges = self._result(self.dht.run_coroutine(slow_charges, return_future=True), "dht_call_failed")
        if isinstance(charges, dict) and sum(charges.values()) > self.drops["slow_peer"]:
            self.drops["slow_peer"] = sum(charges.values())  # the DHT process keeps the running total

    def _result(self, future, reason: str, deadline: float | None = None):
        """A DHT call's result, or `_FAILED` (counted under `reason`) if it raised or outlived its deadline."""
        timeout = self.hcfg.rpc_timeout_s if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            return future.result(timeout=timeout)
        except Exception as e:  # hivemind raises its own errors, and TimeoutError here
            future.cancel()
            self.drops[reason] += 1
            logger.debug("DHT call failed (%s): %r", reason, e)
            return _FAILED

    def _report(self, round_: int, out: list[PeerRecord], before: tuple[int, dict[str, int]]) -> None:
        """Drops: one line per round, not per record. Silence while peers are listed: one WARNING per K rounds."""
        dropped = sum(self.drops.values()) - before[0]
        if dropped:
            delta = {k: v - before[1].get(k, 0) for k, v in self.drops.items() if v != before[1].get(k, 0)}
            logger.warning("round %d: dropped %d DHT record(s) %s", round_, dropped, delta)
        if out or not self.known:
            self.starved_rounds = 0
            return
        self.starved_rounds += 1
        if self.starved_rounds % self.hcfg.starved_warn_rounds == 0:
            logger.warning(
                "round %d: NO records from any of %d known peers for %d rounds: this node may be cut "
                "off from the swarm (drops so far: %s)",
                round_,
                len(self.known),
                self.starved_rounds,
                dict(self.drops),
            )

    def close(self) -> None:
        self.dht.shutdown()
