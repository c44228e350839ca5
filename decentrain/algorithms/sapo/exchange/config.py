"""The `exchange` section: which entry, a payload's cap on the wire, and each entry's own settings.

`exchange.hivemind` (`HivemindConfig`) is the hivemind entry's; silo and collective have none of their
own. Every field is checked when the config is built, before any node or DHT starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from decentrain.algorithms.sapo.exchange.base import EXCHANGES
from decentrain.core.config_checks import check_range

# Upper bounds of the time fields: a day is far beyond any sane swarm setting, and it keeps
# every sum of them (deadlines, expirations) finite.
_DAY_S = 86400.0


def check_hivemind_config(h: HivemindConfig) -> None:
    """Every field finite and in range; the error names the field (`config error:` in the recipe)."""
    for name in ("ttl_s", "poll_s", "max_ttl_s", "rpc_timeout_s", "rpc_wait_s", "slow_rpc_s", "slow_ban_s"):
        check_range(f"exchange.hivemind.{name}", getattr(h, name), low=0.0, high=_DAY_S, low_open=True)
    check_range("exchange.hivemind.wait_s", h.wait_s, low=0.0, high=_DAY_S)
    check_range("exchange.hivemind.min_peers", h.min_peers, low=0, high=1 << 20)
    if h.ttl_s > h.max_ttl_s:
        raise ValueError(f"exchange.hivemind.ttl_s={h.ttl_s} must be <= max_ttl_s={h.max_ttl_s}")
    if h.slow_rpc_s > h.rpc_wait_s:
        raise ValueError(f"exchange.hivemind.slow_rpc_s={h.slow_rpc_s} must be <= rpc_wait_s={h.rpc_wait_s}")
    check_range(
        "exchange.hivemind.max_record_bytes", h.max_record_bytes, low=0, high=2 << 20, low_open=True, high_open=True
    )
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
    hivemind: HivemindConfig = field(default_factory=HivemindConfig)  # the hivemind entry's own settings

    def __post_init__(self) -> None:
        EXCHANGES.get(self.name, field="exchange.name")
        check_range("exchange.max_bytes", self.max_bytes, low=1, high=1 << 31)
