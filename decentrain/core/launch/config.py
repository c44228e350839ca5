"""How a run's workers are started: the `launcher` config section (see core/launch/launcher.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# local: start the workers here; torchrun: already under torchrun; hosts: this host's share of a job
# over several hosts (launch/multinode.sh, launch/slurm.sbatch; docs/multihost.md)
LAUNCHERS = ("local", "torchrun", "hosts")


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
    # launcher=hosts: the job store's HOST:PORT (gossip algorithms; core/comm/job_store.py), this host's
    # place among nnodes, and the job's id (the same on every host)
    store: str = ""
    node_rank: int = 0
    job_id: str = ""
    # torchft's settings moved to its transport (transports/torchft_groups.py, conf/transport/torchft.yaml)
    MOVED: ClassVar[dict[str, str]] = {
        "fault_tolerance": "transport=torchft",
        "replicas": "transport.replicas (with transport=torchft)",
        "torchft": "transport=torchft, whose section holds those fields (transport.lighthouse, transport.replica_id, ...)"}

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
        if self.name == "hosts":
            check_hosts(self)
        elif self.store:
            raise ValueError(f"launcher.store={self.store!r} is for launcher=hosts only (a job over several hosts)")

    @property
    def world_size(self) -> int | None:
        return None if self.nproc_per_node is None else self.nproc_per_node * self.nnodes


def check_hosts(cfg: LauncherConfig) -> None:
    """launcher=hosts: a job store address, a node rank in range, a job id and a rank count (ValueError, one line)."""
    from decentrain.core.comm.job_store import parse_endpoint  # torch.distributed: only when this launcher is used

    parse_endpoint(cfg.store)
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise ValueError(f"launcher.node_rank={cfg.node_rank} must be in [0, launcher.nnodes={cfg.nnodes})")
    if not cfg.job_id or not cfg.job_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"launcher.job_id={cfg.job_id!r} must be a non-empty id ([A-Za-z0-9._-]), the same on every host")
    if cfg.nproc_per_node is None:
        raise ValueError("launcher.nproc_per_node=null: launcher=hosts starts the ranks itself; give the count")
