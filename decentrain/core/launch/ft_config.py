"""`launcher.fault_tolerance` and `launcher.torchft`: replica groups that outlive each other (torchft).

With `launcher.fault_tolerance=torchft` a collective run (DDP, DiLoCo, Streaming DiLoCo) is
`launcher.replicas` replica groups, each its own torchrun job of `launcher.nproc_per_node`
ranks. torchft's Lighthouse forms a quorum of the live groups before every step (DDP) or
sync (DiLoCo); its Manager runs the cross-group collectives on a reconfigurable gloo group,
drops a dead group from the next quorum and heals a restarted or new one from a live peer.
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_TOLERANCE = ("none", "torchft")


@dataclass
class TorchFTConfig:
    # http://host:port of a running `torchft_lighthouse`; null: the local launcher starts one
    lighthouse: str | None = None
    # this replica group's index in [0, launcher.replicas); set by the launcher (or by hand on other hosts)
    replica_id: int | None = None
    min_replicas: int = 1  # groups a step/sync needs to commit (Manager.min_replica_size, lighthouse min_replicas)
    # the lighthouse waits this long for live (heartbeating) groups to join a quorum
    join_timeout_ms: int = 60_000
    # a group silent this long is dead: the next quorum goes on without it
    heartbeat_timeout_ms: int = 5_000  # torchft's default; 1 s split quorums on 2 loaded cores (stale heartbeats)
    quorum_tick_ms: int = 20
    timeout_s: float = 60.0  # one collective or state transfer
    quorum_timeout_s: float = 60.0  # waiting for a quorum

    def __post_init__(self) -> None:
        if self.replica_id is not None and self.replica_id < 0:
            raise ValueError(f"launcher.torchft.replica_id={self.replica_id} must be >= 0")
        if self.min_replicas < 1:
            raise ValueError(f"launcher.torchft.min_replicas={self.min_replicas} must be >= 1")
        for name in ("join_timeout_ms", "heartbeat_timeout_ms", "quorum_tick_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"launcher.torchft.{name}={getattr(self, name)} must be >= 1")
        for name in ("timeout_s", "quorum_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"launcher.torchft.{name}={getattr(self, name)} must be > 0")


def check_fault_tolerance(mode: str, replicas: int, ft: TorchFTConfig) -> None:
    if mode not in FAULT_TOLERANCE:
        raise ValueError(f"launcher.fault_tolerance={mode!r} is unknown; allowed: {list(FAULT_TOLERANCE)}")
    if replicas < 1:
        raise ValueError(f"launcher.replicas={replicas} must be >= 1")
    if mode == "none" and replicas != 1:
        raise ValueError(f"launcher.replicas={replicas} needs launcher.fault_tolerance=torchft (allowed without: 1)")
    if ft.replica_id is not None and ft.replica_id >= replicas:
        raise ValueError(f"launcher.torchft.replica_id={ft.replica_id} must be in [0, launcher.replicas={replicas})")
    if ft.min_replicas > replicas:
        raise ValueError(f"launcher.torchft.min_replicas={ft.min_replicas} must be <= launcher.replicas={replicas}")
