"""How a run's workers are started: the `launcher` config section (see core/launcher.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from decentrain.core.ft_config import TorchFTConfig, check_fault_tolerance

LAUNCHERS = ("local", "torchrun")


@dataclass
class LauncherConfig:
    name: str = "local"
    nproc_per_node: int | None = 2  # None: whatever torchrun started
    nnodes: int = 1
    rdzv_endpoint: str = "localhost:0"
    max_restarts: int = 0
    # validate the config for this layout (nproc_per_node x nnodes), then exit: launch/slurm.sbatch
    # runs it once before torchrun, so a bad config fails once instead of once per restart and rank
    check_only: bool = False
    fault_tolerance: str = "none"  # none | torchft (core/ft_config.py)
    replicas: int = 1  # torchft: replica groups, each its own torchrun job of nproc_per_node ranks
    torchft: TorchFTConfig = field(default_factory=TorchFTConfig)

    def __post_init__(self) -> None:
        if self.name not in LAUNCHERS:
            raise ValueError(f"launcher.name={self.name!r} is unknown; allowed: {list(LAUNCHERS)}")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"launcher.nproc_per_node={self.nproc_per_node} must be >= 1")
        if self.nnodes < 1:
            raise ValueError(f"launcher.nnodes={self.nnodes} must be >= 1")
        if self.name == "local" and self.nnodes != 1:
            raise ValueError(f"launcher.nnodes={self.nnodes}: launcher=local starts workers on this machine only; "
                             "for several nodes use launch/multinode.sh (torchrun, launcher=torchrun)")
        check_fault_tolerance(self.fault_tolerance, self.replicas, self.torchft)

    @property
    def world_size(self) -> int | None:
        return None if self.nproc_per_node is None else self.nproc_per_node * self.nnodes
