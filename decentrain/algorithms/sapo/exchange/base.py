"""What every rollout exchange is: the records it hands back, the contract it keeps, the registry it joins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from decentrain.core.registry import Registry

if TYPE_CHECKING:
    from decentrain.algorithms.sapo.exchange.config import ExchangeConfig
    from decentrain.core.world import World


@dataclass(frozen=True)
class PeerRecord:
    source: str  # where it came from, for drop logs
    data: bytes  # raw, unvalidated
    # The round the record was published under. Independent nodes count rounds on their own, so
    # the decoder checks a payload against this (freshness is the DHT's TTL); None: our round.
    round: int | None = None


class RolloutExchange(Protocol):
    """One node's exchange, as an entry builds it (`Exchange.build`)."""

    def exchange(
        self,
        round_: int,
        payload: bytes,
        is_valid: Callable[[PeerRecord], bool] | None = None,
        ends_wait: Callable[[PeerRecord], bool] | None = None,
    ) -> list[PeerRecord]:
        """Publish `payload` for `round_`; return peers' records not returned before.

        `is_valid` (the caller's decoder, without side effects): backends that wait for peers
        return and count only records that pass it, so a rejected record cannot stand in for a peer.
        `ends_wait` (default: every valid record): which of those count towards the wait and earn
        their peer read priority, so valid payloads of useless groups can neither close the round
        before a useful peer's record lands nor crowd that peer out of the reads.
        """
        ...

    def close(self) -> None: ...


class Exchange:
    """A registry entry: one kind of exchange, what it is known before any is built. The silo and collective
    exchanges are their own entries; hivemind's is a separate class, so that it registers without hivemind."""

    has_peers: bool = True  # False: the node trains alone (no external rollouts to take)
    joins_process_group: bool = False  # True: every node is a rank of one torch.distributed job (launched together)
    # the class of the entry's own settings, under `exchange.<name>` (register(name, config=...)); None: it has none
    config_cls: type | None = None

    @classmethod
    def build(cls, cfg: ExchangeConfig, world: World, node_id: str) -> RolloutExchange:
        """This node's exchange, from the `exchange` section."""
        return cls(cfg, world, node_id)  # type: ignore[call-arg]


EXCHANGES: Registry[type[Exchange]] = Registry("exchange")
