"""How a run's workers are started: the `launcher` section, and the launchers `launcher.name` picks.

Each launcher is an entry of `LAUNCHERS` with its own config class: `local` starts the workers on this
machine, `torchrun` takes the world from torchrun's environment (launch/*.sh, Slurm), and `hosts` starts
this host's share of a job over several hosts (launch/multinode.sh, launch/slurm.sbatch; docs/multihost.md).
An entry's `launch` starts one job's workers with core/launch/launcher.py's functions when the recipe is
not already under torchrun.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from decentrain.core.registry import Registry

FIELD = "launcher"


@dataclass
class LauncherConfig:
    """The fields every launcher has; each entry's config class adds its own."""

    name: str = "local"
    nproc_per_node: int | None = 2  # None: whatever torchrun started
    nnodes: int = 1
    rdzv_endpoint: str = "localhost:0"
    max_restarts: int = 0
    # validate the config for this layout (nproc_per_node x nnodes), then exit: launch/slurm.sbatch
    # runs it once before torchrun, so a bad config fails once instead of once per restart and rank
    check_only: bool = False
    # torchft's settings moved to its transport (transports/torchft_groups.py, conf/transport/torchft.yaml)
    MOVED: ClassVar[dict[str, str]] = {
        "fault_tolerance": "transport=torchft",
        "replicas": "transport.replicas (with transport=torchft)",
        "torchft": "transport=torchft, whose section holds those fields (transport.lighthouse, ...)",
    }

    @classmethod
    def convert(cls, raw: Mapping[str, Any], where: str = FIELD, default: "LauncherConfig | None" = None):
        """The section typed by its launcher's own class (core/typed.py calls this for a registry-picked section)."""
        return LAUNCHERS.config(raw, where)

    def __post_init__(self) -> None:
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"launcher.nproc_per_node={self.nproc_per_node} must be >= 1")
        if self.nnodes < 1:
            raise ValueError(f"launcher.nnodes={self.nnodes} must be >= 1")

    @property
    def world_size(self) -> int | None:
        return None if self.nproc_per_node is None else self.nproc_per_node * self.nnodes


@dataclass
class LocalConfig(LauncherConfig):
    name: str = "local"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nnodes != 1:
            raise ValueError(
                f"launcher.nnodes={self.nnodes}: launcher=local starts workers on this machine only; "
                "for several nodes use launch/multinode.sh (torchrun, launcher=torchrun)"
            )


@dataclass
class TorchrunConfig(LauncherConfig):
    name: str = "torchrun"
    nproc_per_node: int | None = None  # torchrun's


@dataclass
class HostsConfig(LauncherConfig):
    name: str = "hosts"
    # the job store's HOST:PORT (gossip algorithms; core/comm/job_store.py), this host's place among nnodes,
    # and the job's id (the same on every host)
    store: str = ""
    node_rank: int = 0
    job_id: str = ""

    def __post_init__(self) -> None:
        """A job store address, a node rank in range, a job id and a rank count (ValueError, one line)."""
        super().__post_init__()
        from decentrain.core.comm.job_store import parse_endpoint  # torch.distributed: only when this launcher is used

        parse_endpoint(self.store)
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"launcher.node_rank={self.node_rank} must be in [0, launcher.nnodes={self.nnodes})")
        if not self.job_id or not self.job_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(
                f"launcher.job_id={self.job_id!r} must be a non-empty id ([A-Za-z0-9._-]), the same on every host"
            )
        if self.nproc_per_node is None:
            raise ValueError("launcher.nproc_per_node=null: launcher=hosts starts the ranks itself; give the count")


class Launcher:
    """One entry: how this host starts a job's workers. Class methods only."""

    config_cls: type[LauncherConfig] = LauncherConfig

    @classmethod
    def launch(
        cls, argv: list[str], cfg: LauncherConfig, *, module: str, run_dir: str | os.PathLike, survivors: bool
    ) -> None:
        """Start one job's `launcher.nproc_per_node` workers (`python -m <module> <argv>`) and wait for them.

        `survivors` (the algorithm's `survives_peer_loss`) on one node: `launch_survivors`, so a dead worker
        costs its partners a round, not the job; RuntimeError when no worker finished. Otherwise torch elastic
        (`launch_workers`, as torchrun runs it): one failure stops all, `max_restarts` restarts the group.
        """
        from decentrain.core.launch.launcher import launch_survivors, launch_workers  # torch's launcher API

        if survivors and cfg.nnodes == 1:
            launch_survivors(argv, cfg.nproc_per_node, run_dir, module=module, max_restarts=cfg.max_restarts)
        else:
            launch_workers(argv, cfg.nproc_per_node, cfg.nnodes, cfg.rdzv_endpoint, cfg.max_restarts, module=module)


# each launcher registers its class with its own config class: LAUNCHERS.register("<name>", config=...)
LAUNCHERS: Registry[type[Launcher]] = Registry(FIELD, config=LauncherConfig)


@LAUNCHERS.register("local", config=LocalConfig)
class Local(Launcher):
    pass


@LAUNCHERS.register("torchrun", config=TorchrunConfig)
class Torchrun(Launcher):
    """Under torchrun the recipe launches nothing; outside it, `launcher.nproc_per_node` ranks start as `local`
    would (over `launcher.nnodes` nodes through torch elastic's rendezvous at `launcher.rdzv_endpoint`)."""


@LAUNCHERS.register("hosts", config=HostsConfig)
class Hosts(Launcher):
    @classmethod
    def launch(
        cls, argv: list[str], cfg: HostsConfig, *, module: str, run_dir: str | os.PathLike, survivors: bool
    ) -> None:
        """Survivors: this host's launcher is a client of the job store, so a dead host costs its partners a
        round and a host started in its place heals its ranks. Others: torch elastic, `job_id` the rendezvous id."""
        from decentrain.core.launch.launcher import HostSlot, launch_survivors, launch_workers  # torch's launcher API

        if survivors:
            launch_survivors(
                argv,
                cfg.nproc_per_node,
                run_dir,
                module=module,
                max_restarts=cfg.max_restarts,
                slot=HostSlot(cfg.store, cfg.node_rank, cfg.nnodes, cfg.job_id),
            )
        else:
            launch_workers(
                argv,
                cfg.nproc_per_node,
                cfg.nnodes,
                cfg.rdzv_endpoint,
                cfg.max_restarts,
                module=module,
                run_id=cfg.job_id,
            )
