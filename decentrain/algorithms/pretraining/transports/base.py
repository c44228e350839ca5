"""The transport registry: `Door` (one entry), its common config and the selection by config.

The package's `__init__` imports every entry module (core/registry.discover); see there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from decentrain.algorithms.base import ALGORITHMS, Algorithm
from decentrain.core.comm.transport import Transport
from decentrain.core.registry import Registry
from decentrain.core.typed import typed
from decentrain.core.world import World

FIELD = "transport"
# `transport.name: null` (the default): the door the launcher's mode implies, so that
# `launcher.fault_tolerance=torchft` alone keeps selecting torchft's groups
LAUNCHER_DOORS = {"none": "torch", "torchft": "torchft"}
DEFAULT_DOOR = LAUNCHER_DOORS["none"]


@dataclass
class TransportConfig:
    """The `transport` section; each entry subclasses it with its own fields."""

    name: str | None = None  # null: LAUNCHER_DOORS[launcher.fault_tolerance]

    @classmethod
    def convert(cls, raw: Mapping[str, Any], where: str = FIELD, default: "TransportConfig | None" = None):
        return transport_config(raw)


class Door:
    """One registry entry. Class methods only: an entry is a kind of network, not a connection."""

    config_cls: type[TransportConfig] = TransportConfig

    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        """ValueError naming the field for a run this door cannot carry; `cfg` is a TrainConfig."""

    @classmethod
    def transport(cls, world: World, cfg: TransportConfig) -> Transport:
        """Replica `world.rank`'s view of the others."""
        raise NotImplementedError

    @classmethod
    def algorithm(cls, cfg, world: World) -> Algorithm:
        """The run's algorithm for this replica, talking through this door."""
        algorithm = ALGORITHMS.get(cfg.algorithm.name)(cfg.algorithm, world)
        if hasattr(algorithm, "transport"):  # loop algorithms without one (DDP) use torch.distributed's DDP
            algorithm.transport = cls.transport(world, cfg.transport)
        return algorithm

    @classmethod
    def attach(cls, trainer, cfg, world: World) -> None:
        """What the door changes in a built trainer (torchft: each group reads its own data slice)."""

    @classmethod
    def launch(cls, cfg, overrides: list[str], run_dir: Path, module: str) -> bool:
        """Outside torchrun: start the run's processes and return True, or False to run in this process."""
        return False


TRANSPORTS: Registry[type[Door]] = Registry(FIELD)


def door_name(cfg) -> str:
    """The entry a TrainConfig selects: `transport.name`, or the launcher's door when it is null."""
    return cfg.transport.name or LAUNCHER_DOORS[cfg.launcher.fault_tolerance]


def door(cfg) -> type[Door]:
    return TRANSPORTS.get(door_name(cfg), field=f"{FIELD}.name")


def transport_config(raw: Mapping[str, Any] | TransportConfig | None) -> TransportConfig:
    """The typed `transport` section of the entry `raw["name"]` names; unknown keys fail naming the field."""
    if isinstance(raw, TransportConfig):
        return raw
    raw = dict(raw or {})
    name = raw.get("name")
    cls = TransportConfig if name is None else TRANSPORTS.get(name, field=f"{FIELD}.name").config_cls
    return typed(cls, raw, FIELD)

