"""Rollout exchange: publish this node's encoded payload, fetch the peers' raw bytes.

Backends, keyed by `exchange.name`:
  silo        no peers (J must be 0)
  collective  all_gather of bytes inside one torchrun job: synchronous, like the paper's runs
  hivemind    a DHT of independent processes that join and leave; each peer's latest record,
              identified by (round, peer), expires after a TTL; no barrier: a node takes
              whatever new records have arrived

Backends move bytes only; decoding and validation (`PayloadDecoder`) is the caller's job.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from decentrain.core.bytes_comm import all_gather_bytes
from decentrain.core.registry import Registry
from decentrain.core.world import World

logger = logging.getLogger(__name__)


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

    def __post_init__(self) -> None:
        for name in ("ttl_s", "poll_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"exchange.hivemind.{name}={getattr(self, name)} must be > 0")
        if self.wait_s < 0 or self.min_peers < 0:
            raise ValueError("exchange.hivemind.wait_s and exchange.hivemind.min_peers must be >= 0")


@dataclass
class ExchangeConfig:
    name: str = "collective"  # silo | collective | hivemind
    max_bytes: int = 4 << 20  # per payload on the wire (the decoder applies payload.max_bytes too)
    hivemind: HivemindConfig = field(default_factory=HivemindConfig)

    def __post_init__(self) -> None:
        EXCHANGES.get(self.name, field="exchange.name")
        if self.max_bytes <= 0:
            raise ValueError(f"exchange.max_bytes={self.max_bytes} must be > 0")


@dataclass(frozen=True)
class PeerRecord:
    source: str  # where it came from, for drop logs
    data: bytes  # raw, unvalidated
    # The round the record was published under. Independent nodes count rounds on their own, so
    # the decoder checks a payload against this (freshness is the DHT's TTL); None: our round.
    round: int | None = None


class RolloutExchange(Protocol):
    def exchange(self, round_: int, payload: bytes) -> list[PeerRecord]:
        """Publish `payload` for `round_`; return peers' records not returned before."""
        ...

    def close(self) -> None: ...


EXCHANGES: Registry[type] = Registry("exchange")


@EXCHANGES.register("silo")
class SiloExchange:
    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        pass

    def exchange(self, round_: int, payload: bytes) -> list[PeerRecord]:
        return []

    def close(self) -> None:
        pass


@EXCHANGES.register("collective")
class CollectiveExchange:
    """One all_gather of bytes per round; every rank of the job is a node."""

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        self.cfg, self.world = cfg, world

    def exchange(self, round_: int, payload: bytes) -> list[PeerRecord]:
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
    """One DHT key, `<prefix>/rollouts`; subkey = node id; value = {"round": r, "payload": bytes}.

    A newer store replaces a peer's older one, so a fetch returns at most one record per live
    peer (nodes that left fade out after `ttl_s`), and the (round, peer) pairs already returned
    are skipped.
    """

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        import hivemind  # optional dependency: `pip install decentrain[swarm]`

        self.cfg, self.hcfg, self.node_id = cfg, cfg.hivemind, node_id
        self.key = f"{self.hcfg.prefix}/rollouts"
        self.seen: set[tuple[int, str]] = set()
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
        )
        self.maddrs = [str(m) for m in self.dht.get_visible_maddrs()]
        if peers_file is not None:
            _append_peers(peers_file, self.maddrs)
        logger.info("hivemind node %s at %s (joined via %d peers)", node_id, self.maddrs, len(peers))

    def _collect(self) -> list[PeerRecord]:
        found = self.dht.get(self.key, latest=True)
        if found is None or not isinstance(found.value, dict):
            return []
        out = []
        for peer, record in found.value.items():
            value = getattr(record, "value", None)
            # Anything a peer stored is untrusted: only {"round": int, "payload": bytes} goes on.
            if peer == self.node_id or not isinstance(value, dict):
                continue
            round_, data = value.get("round"), value.get("payload")
            if not isinstance(round_, int) or isinstance(round_, bool):
                round_, data = None, b""  # the decoder counts it as a drop
            if (round_, str(peer)) in self.seen:
                continue
            self.seen.add((round_, str(peer)))
            out.append(PeerRecord(f"{peer}@{round_}", data if isinstance(data, bytes) else b"", round_))
        return out

    def exchange(self, round_: int, payload: bytes) -> list[PeerRecord]:
        from hivemind.utils import get_dht_time

        if len(payload) > self.cfg.max_bytes:
            raise ValueError(f"payload of {len(payload)} bytes exceeds exchange.max_bytes={self.cfg.max_bytes}")
        record = {"round": round_, "payload": payload}
        self.dht.store(self.key, record, expiration_time=get_dht_time() + self.hcfg.ttl_s, subkey=self.node_id)
        # No barrier: poll briefly for new records, then go on with whatever arrived.
        deadline = time.monotonic() + self.hcfg.wait_s
        out = self._collect()
        while len(out) < self.hcfg.min_peers and time.monotonic() < deadline:
            time.sleep(self.hcfg.poll_s)
            out += self._collect()
        return out

    def close(self) -> None:
        self.dht.shutdown()


def build_exchange(cfg: ExchangeConfig, world: World, node_id: str) -> RolloutExchange:
    return EXCHANGES.get(cfg.name, field="exchange.name")(cfg, world, node_id)
