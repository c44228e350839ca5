"""`exchange.name: collective`: one all_gather of bytes per round inside one torchrun job, every rank a
node. Synchronous, like the paper's runs: the ranks' rounds line up, so records carry no round."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from decentrain.algorithms.sapo.exchange.base import EXCHANGES, Exchange, PeerRecord
from decentrain.core.comm.bytes_comm import all_gather_bytes

if TYPE_CHECKING:
    from decentrain.algorithms.sapo.exchange.config import ExchangeConfig
    from decentrain.core.world import World

logger = logging.getLogger(__name__)


@EXCHANGES.register("collective")
class CollectiveExchange(Exchange):
    """One all_gather of bytes per round; every rank of the job is a node."""

    has_peers, joins_process_group = True, True

    def __init__(self, cfg: ExchangeConfig, world: World, node_id: str):
        self.cfg, self.world = cfg, world

    def exchange(self, round_: int, payload: bytes, is_valid=None, ends_wait=None) -> list[PeerRecord]:
        if len(payload) > self.cfg.max_bytes:  # publish nothing this round, keep training
            logger.warning(
                "round %d: own payload of %d bytes exceeds exchange.max_bytes=%d; not published",
                round_,
                len(payload),
                self.cfg.max_bytes,
            )
            payload = b""
        gathered = all_gather_bytes(self.world, payload, max_bytes=self.cfg.max_bytes)
        return [PeerRecord(f"rank{r}", data) for r, data in enumerate(gathered) if r != self.world.rank]

    def close(self) -> None:
        pass
