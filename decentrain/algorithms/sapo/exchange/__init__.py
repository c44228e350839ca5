"""Rollout exchange: publish this node's encoded payload, fetch the peers' raw bytes.

Entries, keyed by `exchange.name`, each in its own module and registered on `EXCHANGES`:
  silo        silo.py: no peers (J must be 0)
  collective  collective.py: all_gather of bytes inside one torchrun job: synchronous, like the paper's runs
  hivemind    hivemind.py: a DHT of independent processes that join and leave; each peer's latest record
              lives under that peer's own signed key and expires after a capped TTL; no barrier: a node
              takes whatever new records have arrived (rules: `dht_guard`)

The section and each entry's own settings: config.py. The contract (`RolloutExchange`) and the registry:
base.py. Backends move bytes only; decoding and validation are the receiver's (`sapo/inbox.py`).
"""

from __future__ import annotations

from decentrain.algorithms.sapo.exchange.base import EXCHANGES, Exchange, PeerRecord, RolloutExchange
from decentrain.algorithms.sapo.exchange.collective import CollectiveExchange
from decentrain.algorithms.sapo.exchange.config import ExchangeConfig, HivemindConfig, check_hivemind_config
from decentrain.algorithms.sapo.exchange.silo import SiloExchange
from decentrain.core.world import World

__all__ = [
    "EXCHANGES",
    "CollectiveExchange",
    "Exchange",
    "ExchangeConfig",
    "HivemindConfig",
    "PeerRecord",
    "RolloutExchange",
    "SiloExchange",
    "build_exchange",
    "check_hivemind_config",
]


@EXCHANGES.register("hivemind", config=HivemindConfig)
class HivemindEntry(Exchange):
    """The hivemind entry, registered here without importing hivemind (the optional `swarm` extra), so a
    config naming it is checked on any machine; the exchange itself is loaded when a node builds one."""

    has_peers, joins_process_group = True, False

    @classmethod
    def build(cls, cfg: ExchangeConfig, world: World, node_id: str) -> RolloutExchange:
        from decentrain.algorithms.sapo.exchange.hivemind import HivemindExchange  # needs hivemind

        return HivemindExchange(cfg, world, node_id)


def build_exchange(cfg: ExchangeConfig, world: World, node_id: str) -> RolloutExchange:
    return EXCHANGES.get(cfg.name, field="exchange.name").build(cfg, world, node_id)
