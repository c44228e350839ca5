"""The transport registry: `TransportSpec` (one entry), its common config and the selection by config.

The package's `__init__` imports every entry module (core/registry.discover); see there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from decentrain.algorithms.base import ALGORITHMS, Algorithm
from decentrain.core.comm.transport import Transport
from decentrain.core.registry import Registry
from decentrain.core.world import World
from decentrain.data.blocks import ShardedSampler

FIELD = "transport"
DEFAULT_TRANSPORT = "torch"


@dataclass
class TransportConfig:
    """The `transport` section; each entry subclasses it with its own fields."""

    name: str | None = DEFAULT_TRANSPORT

    @classmethod
    def convert(cls, raw: Mapping[str, Any], where: str = FIELD, default: "TransportConfig | None" = None):
        """The section typed by its entry's own class (core/typed.py calls this for a registry-picked section)."""
        return TRANSPORTS.config(raw, where)


class TransportSpec:
    """One registry entry: a kind of transport (class methods only), not a connection; `connect` makes
    one replica's connection, a `core/comm/transport.Transport`."""

    config_cls: type[TransportConfig] = TransportConfig

    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        """ValueError naming the field for a run this transport cannot carry; `cfg` is a TrainConfig."""

    @classmethod
    def connect(cls, world: World, cfg: TransportConfig) -> Transport:
        """Replica `world.rank`'s connection to the others."""
        raise NotImplementedError

    @classmethod
    def algorithm(cls, cfg, world: World) -> Algorithm:
        """The run's algorithm for this replica, talking through this transport."""
        algorithm = ALGORITHMS.get(cfg.algorithm.name)(cfg.algorithm, world)
        if hasattr(type(algorithm), "transport"):  # loop algorithms without one (DDP) use torch.distributed's DDP
            algorithm.transport = cls.connect(world, cfg.transport)
        return algorithm

    @classmethod
    def sampler(cls, cfg, world: World) -> Callable[[int], ShardedSampler] | None:
        """How this rank draws its batches from n training blocks, for the Trainer; None: the Trainer's own
        (each rank its slice of one seeded order). torchft: each replica group reads its own slice."""
        return None

    @classmethod
    def heals_on_restart(cls, cfg) -> bool:
        """A worker restarted by torchrun heals from a live peer (rather than resuming from a checkpoint)."""
        return False

    @classmethod
    def launch(cls, cfg, overrides: list[str], run_dir: Path, module: str) -> bool:
        """Outside torchrun: start the run's processes and return True, or False to run in this process."""
        return False


# each entry module registers its class, with its config class if it has fields: TRANSPORTS.register(name, config=...)
TRANSPORTS: Registry[type[TransportSpec]] = Registry(FIELD, config=TransportConfig)


def transport_spec(cfg) -> type[TransportSpec]:
    """The entry a TrainConfig's `transport.name` selects."""
    return TRANSPORTS.get(cfg.transport.name, field=f"{FIELD}.name")
