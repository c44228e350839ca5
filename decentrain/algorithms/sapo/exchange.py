"""Rollout exchange: publish this node's encoded payload, fetch the peers' raw bytes.

Backends, keyed by `exchange.name`:
  silo        no peers (J must be 0)
  collective  all_gather of bytes inside one torchrun job: synchronous, like the paper's runs
  hivemind    a DHT of independent processes that join and leave; each peer's latest record
              lives under that peer's own signed key and expires after a capped TTL; no
              barrier: a node takes whatever new records have arrived (rules: `dht_guard`)

Backends move bytes only; decoding and validation (`PayloadDecoder`) is the caller's job.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Protocol

from decentrain.algorithms.sapo.peer_selection import PeerSelector
from decentrain.core.comm.bytes_comm import all_gather_bytes
from decentrain.core.config_checks import check_range
from decentrain.core.registry import Registry
from decentrain.core.world import World

logger = logging.getLogger(__name__)
_FAILED = object()  # a DHT call that raised or timed out (None is a real answer: nothing stored)
REGISTRY_FULL_READ = 8  # every 8th registry read waits for all replicas (see _refresh_peers)


# Upper bounds of the time fields: a day is far beyond any sane swarm setting, and it keeps
# every sum of them (deadlines, expirations) finite.
_DAY_S = 86400.0


def check_hivemind_config(h: "HivemindConfig") -> None:
    """Every field finite and in range; the error names the field (`config error:` in the recipe)."""
    for name in ("ttl_s", "poll_s", "max_ttl_s", "rpc_timeout_s", "rpc_wait_s", "slow_rpc_s", "slow_ban_s"):
        check_range(f"exchange.hivemind.{name}", getattr(h, name), low=0.0, high=_DAY_S, low_open=True)
    check_range("exchange.hivemind.wait_s", h.wait_s, low=0.0, high=_DAY_S)
    check_range("exchange.hivemind.min_peers", h.min_peers, low=0, high=1 << 20)
    if h.ttl_s > h.max_ttl_s:
        raise ValueError(f"exchange.hivemind.ttl_s={h.ttl_s} must be <= max_ttl_s={h.max_ttl_s}")
    if h.slow_rpc_s > h.rpc_wait_s:
        raise ValueError(f"exchange.hivemind.slow_rpc_s={h.slow_rpc_s} must be <= rpc_wait_s={h.rpc_wait_s}")
    check_range("exchange.hivemind.max_record_bytes", h.max_record_bytes, low=0, high=2 << 20,
                low_open=True, high_open=True)
    for name in ("max_fetch_bytes", "max_peers_per_round", "max_known_peers", "starved_warn_rounds"):
        check_range(f"exchange.hivemind.{name}", getattr(h, name), low=1, high=1 << 40)


@dataclass
class HivemindConfig:
    initial_peers: list[str] = field(default_factory=list)  # multiaddrs of any live swarm members
    # A file of peers' multiaddrs, shared by the nodes of one machine (launch/sapo_swarm.sh):
    # a node reads it to join (an empty or missing file: it starts the swarm) and then appends
    # its own addresses, so later nodes can join through any live one.
    peers_file: str | None = None
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"])
    announce_maddrs: list[str] = field(default_factory=list)
    # Off by default: otherwise the p2p daemon probes the default gateway for NAT and relays.
    # Internet swarms behind NAT turn these on.
    nat_port_map: bool = False
    use_relay: bool = False
    use_auto_relay: bool = False
    auto_nat: bool = False
    prefix: str = "decentrain_sapo"  # DHT key namespace: swarms with different prefixes do not mix
    ttl_s: float = 120.0  # a record expires from the DHT this long after it was stored
    wait_s: float = 2.0  # wait at most this long for `min_peers` new records
    min_peers: int = 1
    poll_s: float = 0.2
    # One DHT call (a get or a store) waits at most this long. hivemind's own futures carry no
    # deadline, so a call that never returns would stall the node; here it costs that peer's
    # record (a lookup) or this round's publication (a store), never the run.
    rpc_timeout_s: float = 30.0
    # One RPC to one peer (hivemind's DHTNode `wait_timeout`): a peer silent this long is
    # blacklisted by hivemind for `slow_ban_s`, doubled at each repeat.
    rpc_wait_s: float = 3.0
    # A peer whose find or store answer takes longer than this is cut off and blacklisted the
    # same way (dht_guard.guard_slow_peers), so a member answering just under `rpc_wait_s`
    # cannot make every lookup and store wait for it.
    slow_rpc_s: float = 1.0
    slow_ban_s: float = 30.0
    # Receive-side limits: what strangers can make this node store, fetch and hold.
    max_ttl_s: float = 300.0  # records expiring later than now + this are refused (stored or fetched)
    max_record_bytes: int = 1 << 20  # one node's compressed record; below p2pd's 2 MiB unary limit
    max_fetch_bytes: int = 16 << 20  # compressed bytes fetched per round, over all peers
    max_peers_per_round: int = 32  # peers' keys read per round (half by recent valid payloads, half oldest-read)
    max_known_peers: int = 1024  # registry entries remembered; the stalest are forgotten first
    starved_warn_rounds: int = 5  # WARNING once per this many rounds without records while peers are known

    def __post_init__(self) -> None:
        check_hivemind_config(self)


@dataclass
class ExchangeConfig:
    name: str = "collective"  # silo | collective | hivemind
    max_bytes: int = 4 << 20  # per payload on the wire (the decoder applies payload.max_bytes too)
    hivemind: HivemindConfig = field(default_factory=HivemindConfig)

    def __post_init__(self) -> None:
        EXCHANGES.get(self.name, field="exchange.name")
        check_range("exchange.max_bytes", self.max_bytes, low=1, high=1 << 31)


@dataclass(frozen=True)
class PeerRecord:
    source: str  # where it came from, for drop logs
    data: bytes  # raw, unvalidated
    # The round the record was published under. Independent nodes count rounds on their own, so
    # the decoder checks a payload against this (freshness is the DHT's TTL); None: our round.
    round: int | None = None


class RolloutExchange(Protocol):
    has_peers: bool  # False: the node trains alone (no external rollouts to take)
    joins_process_group: bool  # True: every node is a rank of one torch.distributed job (launched together)

    def exchange(self, round_: int, payload: bytes, is_valid: Callable[[PeerRecord], bool] | None = None,
                 ends_wait: Callable[[PeerRecord], bool] | None = None) -> list[PeerRecord]:
        """Publish `payload` for `round_`; return peers' records not returned before.

        `is_valid` (the caller's decoder, without side effects): backends that wait for peers
        return and count only records that pass it, so a rejected record cannot stand in for a peer.
        `ends_wait` (default: every valid record): which of those count towards the wait and earn
        their peer read priority, so valid payloads of useless groups can neither close the round
        before a useful peer's record lands nor crowd that peer out of the reads.
        """
        ...

    def close(self) -> None: ...


EXCHANGES: Registry[type] = Registry("exchange")


@EXCHANGES.register("silo")
class SiloExchange:
    has_peers, joins_process_group = False, False

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        pass

    def exchange(self, round_: int, payload: bytes, is_valid=None, ends_wait=None) -> list[PeerRecord]:
        return []

    def close(self) -> None:
        pass


@EXCHANGES.register("collective")
class CollectiveExchange:
    """One all_gather of bytes per round; every rank of the job is a node."""

    has_peers, joins_process_group = True, True

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        self.cfg, self.world = cfg, world

    def exchange(self, round_: int, payload: bytes, is_valid=None, ends_wait=None) -> list[PeerRecord]:
        if len(payload) > self.cfg.max_bytes:  # publish nothing this round, keep training
            logger.warning("round %d: own payload of %d bytes exceeds exchange.max_bytes=%d; not published",
                        round_, len(payload), self.cfg.max_bytes)
            payload = b""
        gathered = all_gather_bytes(self.world, payload, max_bytes=self.cfg.max_bytes)
        return [PeerRecord(f"rank{r}", data) for r, data in enumerate(gathered) if r != self.world.rank]

    def close(self) -> None:
        pass


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


@EXCHANGES.register("hivemind")
class HivemindExchange:
    """Per-node DHT keys (layout and record rules: `dht_guard`); no barrier between nodes.

    Each round a node signs and stores its compressed record under its own key and refreshes
    its registry entry, reads the registry, then polls up to `max_peers_per_round` peers' keys
    for at most `wait_s`. Each peer yields at most one record per round (the rate limit), only
    with a round above the last one taken from it (its high-water mark: replays and round
    rollbacks are dropped), only within the round's byte budget, and only if it inflates within
    `exchange.max_bytes`; byte-identical payloads already taken (a replay under another key) are
    dropped too. Drops are counted in `self.drops` and logged once per round.
    """

    has_peers, joins_process_group = True, False

    _DIGESTS = 4096  # payload digests remembered for replay detection

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        import hivemind  # optional dependency: `pip install decentrain[swarm]`
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.utils.crypto import RSAPrivateKey

        from decentrain.algorithms.sapo.dht_guard import (SwarmRecordValidator, guard_slow_peers, registry_key,
                                                          rollouts_key)

        self.cfg, self.hcfg, self.node_id = cfg, cfg.hivemind, node_id
        # A fresh key per exchange (not hivemind's process-wide one): two nodes in one process stay two owners.
        signer = RSASignatureValidator(RSAPrivateKey())
        self.marker = signer.local_public_key
        self.registry = registry_key(self.hcfg.prefix)
        self.own_key = rollouts_key(self.hcfg.prefix, self.marker)
        self.peers = PeerSelector(self.hcfg.max_peers_per_round, self.hcfg.max_known_peers,
                                  seed=int.from_bytes(hashlib.sha256(self.marker).digest()[:4], "little"))
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
            record_validators=[signer, SwarmRecordValidator(self.hcfg.prefix, self.hcfg.max_ttl_s,
                                                            self.hcfg.max_record_bytes)],
        )
        self.dht.run_coroutine(partial(guard_slow_peers, slow_rpc_s=self.hcfg.slow_rpc_s))
        self.maddrs = [str(m) for m in self.dht.get_visible_maddrs()]
        if peers_file is not None:
            _append_peers(peers_file, self.maddrs)
        logger.info("hivemind node %s at %s (joined via %d peers)", node_id, self.maddrs, len(peers))

    # -- peers -----------------------------------------------------------------------------------

    def _refresh_peers(self) -> None:
        from decentrain.algorithms.sapo.dht_guard import owner_of

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
        from decentrain.algorithms.sapo.dht_guard import chunk_subkey, max_chunks

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

    def _take(self, marker: bytes, found, budget: list[int], is_valid: Callable[[PeerRecord], bool] | None
              ) -> PeerRecord | None:
        """One peer's record if it passes every receive-side rule; else counts why and returns None."""
        from decentrain.algorithms.sapo.dht_guard import inflate, owner_digest

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

    def _collect(self, round_: int, taken: set[bytes], budgets: tuple[list[int], list[int]],
                 is_valid: Callable[[PeerRecord], bool] | None,
                 ends_wait: Callable[[PeerRecord], bool]) -> tuple[list[PeerRecord], int]:
        """This poll's new records, and how many of them end the wait (each also earns its peer read priority)."""
        from decentrain.algorithms.sapo.dht_guard import rollouts_key

        trusted, explore = self.peers.choose(round_, taken)
        if (left := len(self.known) - len(taken) - len(trusted) - len(explore)) > 0:
            self.drops["peer_budget"] += left
        peers = trusted + explore
        # The first replica holding a record newer than the one last taken from that peer ends
        # the search (no waiting on slower replicas); never taken: any unexpired record does.
        futures = [self.dht.get(rollouts_key(self.hcfg.prefix, m), latest=False, return_future=True,
                                sufficient_expiration_time=self._newer_than(m)) for m in peers]
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

    def exchange(self, round_: int, payload: bytes, is_valid: Callable[[PeerRecord], bool] | None = None,
                 ends_wait: Callable[[PeerRecord], bool] | None = None) -> list[PeerRecord]:
        """Publish, then poll for records until `min_peers` of them pass `is_valid` and `ends_wait`
        (or `wait_s` ends)."""
        from decentrain.algorithms.sapo.dht_guard import compress

        before = sum(self.drops.values()), dict(self.drops)
        data = compress(payload)
        self._remember(payload)  # our own payload coming back under another key is a replay
        if len(payload) > self.cfg.max_bytes or len(data) > self.hcfg.max_record_bytes:
            logger.warning("round %d: own payload of %d bytes (%d compressed) exceeds exchange.max_bytes=%d or "
                           "exchange.hivemind.max_record_bytes=%d; not published", round_, len(payload), len(data),
                           self.cfg.max_bytes, self.hcfg.max_record_bytes)
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
        from hivemind.utils import get_dht_time

        from decentrain.algorithms.sapo.dht_guard import CHUNK_BYTES, chunk_subkey

        chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        expiration = get_dht_time() + self.hcfg.ttl_s
        # One after another, chunk 0 last: a reader that sees this round's chunk 0 finds the rest.
        # Each store returns at its first replica (hivemind goes on storing the rest in the
        # background), so a slow replica delays no publication.
        early = dict(return_future=True, await_all_replicas=False, await_all_tasks=False)
        for i in reversed(range(len(chunks))):
            value = {"round": round_, "n": len(chunks), "payload": chunks[i]}
            stored = self.dht.store(self.own_key, value, expiration_time=expiration,
                                    subkey=chunk_subkey(self.marker, i), **early)
            if self._result(stored, "own_publish_failed") is _FAILED:
                return  # without this chunk the rest is useless to readers: skip this round's publication
        self._result(self.dht.store(self.registry, 1, expiration_time=expiration, subkey=self.marker, **early),
                     "own_publish_failed")

    def _count_slow_peers(self) -> None:
        """Peers charged as slow in the DHT process since the last round: counted as drops."""
        from decentrain.algorithms.sapo.dht_guard import slow_charges

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
            logger.warning("round %d: NO records from any of %d known peers for %d rounds: this node may be cut "
                           "off from the swarm (drops so far: %s)", round_, len(self.known), self.starved_rounds,
                           dict(self.drops))

    def close(self) -> None:
        self.dht.shutdown()


def build_exchange(cfg: ExchangeConfig, world: World, node_id: str) -> RolloutExchange:
    return EXCHANGES.get(cfg.name, field="exchange.name")(cfg, world, node_id)
