"""`exchange.name: silo`: no peers. The node trains alone on its own groups (J must be 0)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from decentrain.algorithms.sapo.exchange.base import EXCHANGES, Exchange, PeerRecord

if TYPE_CHECKING:
    from decentrain.algorithms.sapo.exchange.config import ExchangeConfig
    from decentrain.core.world import World


@EXCHANGES.register("silo")
class SiloExchange(Exchange):
    has_peers, joins_process_group = False, False

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        pass

    def exchange(self, round_: int, payload: bytes, is_valid=None, ends_wait=None) -> list[PeerRecord]:
        return []

    def close(self) -> None:
        pass
