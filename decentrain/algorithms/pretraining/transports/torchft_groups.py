"""`transport=torchft`: replica groups joined by torchft, and every torchft setting (conf/transport/torchft.yaml).

The recipe starts `transport.replicas` groups, each its own torchrun job of `launcher.nproc_per_node`
ranks, and a Lighthouse (pretraining/torchft/launch.py). torchft's Lighthouse forms a quorum of the live
groups before every step (DDP) or sync (DiLoCo); its Manager runs the cross-group collectives on a
reconfigurable gloo group, drops a dead group from the next quorum and heals a restarted or new one
from a live peer. Each collective family registers its torchft variant in `FT_ALGORITHMS`
(ddp/torchft_ddp.py, diloco/torchft_diloco.py), with its own checks (`check_world`); this transport
builds the variant with its group and hands the trainer a sampler that reads the group's own data slice.

Departure from the `Transport` protocol, named: those variants sync through the Manager (torchft's
DDP/DiLoCo wrappers, which heal and re-form quorums themselves), not through `core/comm/transport.py`'s
operations; what this entry shares with the others is the entry: config, checks, how processes start,
the algorithm and the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from decentrain.algorithms.base import Algorithm
from decentrain.algorithms.pretraining.torchft.launch import launch_replica_groups
from decentrain.algorithms.pretraining.torchft.manager import (
    FT_ALGORITHMS,
    ReplicaGroup,
    replica_sampler,
    torchft_available,
)
from decentrain.algorithms.pretraining.transports.base import FIELD, TRANSPORTS, TransportConfig, TransportSpec
from decentrain.core.config_checks import check_range
from decentrain.core.world import World
from decentrain.data.blocks import ShardedSampler


@dataclass
class TorchFTConfig(TransportConfig):
    name: str | None = "torchft"
    replicas: int = 2  # replica groups, each its own torchrun job of launcher.nproc_per_node ranks
    # http://host:port of a running `torchft_lighthouse`; null: the local launcher starts one
    lighthouse: str | None = None
    # this group's index in [0, replicas); set by the launcher (or by hand on other hosts: launch/torchft_replica.sh)
    replica_id: int | None = None
    min_replicas: int = 1  # groups a step/sync needs to commit (Manager.min_replica_size, lighthouse min_replicas)
    join_timeout_ms: int = 60_000  # the lighthouse waits this long for live (heartbeating) groups to join a quorum
    # a group silent this long is dead: the next quorum goes on without it
    heartbeat_timeout_ms: int = 5_000  # torchft's default; 1 s split quorums on 2 loaded cores (stale heartbeats)
    quorum_tick_ms: int = 20
    timeout_s: float = 60.0  # one collective or state transfer
    quorum_timeout_s: float = 60.0  # waiting for a quorum

    def __post_init__(self) -> None:
        check_range(f"{FIELD}.replicas", self.replicas, 1, 1024)
        if self.replica_id is not None:
            check_range(f"{FIELD}.replica_id", self.replica_id, 0, self.replicas, high_open=True)
        check_range(f"{FIELD}.min_replicas", self.min_replicas, 1, self.replicas)
        for name in ("join_timeout_ms", "heartbeat_timeout_ms", "quorum_tick_ms"):
            check_range(f"{FIELD}.{name}", getattr(self, name), 1)
        for name in ("timeout_s", "quorum_timeout_s"):
            check_range(f"{FIELD}.{name}", getattr(self, name), 0, low_open=True)

    def replica_group(self, store_addr: str | None = None, store_port: int | None = None) -> ReplicaGroup:
        """Which group this torchrun job is; the local launcher sets `replica_id` and `lighthouse` for it.
        `store_addr`/`store_port`: the group's own key-value store (None: torchrun's)."""
        if self.replica_id is None or self.lighthouse is None:
            raise ValueError(
                f"{FIELD}=torchft under torchrun needs {FIELD}.replica_id and {FIELD}.lighthouse "
                "(the local launcher sets both; see docs/fault_tolerance.md)"
            )
        return ReplicaGroup(
            self.replica_id,
            self.replicas,
            self.lighthouse,
            self.min_replicas,
            self.timeout_s,
            self.quorum_timeout_s,
            store_addr,
            store_port,
        )

    def lighthouse_options(self) -> dict[str, int]:
        """torchft's LighthouseServer arguments, for a lighthouse the local launcher starts."""
        return {
            "min_replicas": self.min_replicas,
            "join_timeout_ms": self.join_timeout_ms,
            "quorum_tick_ms": self.quorum_tick_ms,
            "heartbeat_timeout_ms": self.heartbeat_timeout_ms,
        }


@TRANSPORTS.register("torchft", config=TorchFTConfig)
class TorchFTSpec(TransportSpec):
    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        if not torchft_available():
            raise ValueError(f"{FIELD}=torchft needs torchft: pip install 'decentrain[ft]'")
        name = cfg.algorithm.name
        if name not in FT_ALGORITHMS:
            raise ValueError(
                f"{FIELD}=torchft does not support algorithm.name={name!r}; "
                f"allowed: {FT_ALGORITHMS.names()} (noloco survives a dead peer on its own)"
            )
        if cfg.engine.name != "torch":
            raise ValueError(f"engine.name={cfg.engine.name!r} with {FIELD}=torchft; allowed: torch")
        FT_ALGORITHMS.get(name).check_world(cfg.algorithm, world_size)  # world_size: the ranks of one group

    @classmethod
    def algorithm(cls, cfg, world: World) -> Algorithm:
        variant = FT_ALGORITHMS.get(cfg.algorithm.name, field="algorithm.name")
        return variant(cfg.algorithm, world, cfg.transport.replica_group(), cfg.train.steps)

    @classmethod
    def sampler(cls, cfg, world: World) -> Callable[[int], ShardedSampler]:
        group = cfg.transport.replica_group()
        return lambda num_blocks: replica_sampler(num_blocks, cfg.train.global_batch_size, world, group, cfg.train.seed)

    @classmethod
    def heals_on_restart(cls, cfg) -> bool:
        return cfg.transport.replicas > 1  # torchrun restarts a group alone: it heals from a live one

    @classmethod
    def launch(cls, cfg, overrides: list[str], run_dir: Path, module: str) -> bool:
        t = cfg.transport
        launch_replica_groups(
            overrides,
            t.replicas,
            cfg.launcher.nproc_per_node or 1,
            str(run_dir),
            t.lighthouse,
            t.lighthouse_options(),
            cfg.launcher.max_restarts,
            module=module,
        )
        return True
