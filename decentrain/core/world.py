"""The one place that reads torchrun's environment and starts torch.distributed.

Everything else receives a `World` explicitly: there are no module-level globals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class LaunchEnv:
    """What torchrun (or our own launcher) told this process, read before any process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    run_id: str | None = None  # shared by every rank of one torchrun job
    restart_count: int = 0  # torch elastic's attempt number (0 before any restart)
    agent_store: bool = False  # the launcher hosts the c10d store (elastic agent, launch_survivors)
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    @property
    def under_torchrun(self) -> bool:
        return self.run_id is not None or "RANK" in os.environ


def read_launch_env() -> LaunchEnv:
    env = os.environ
    return LaunchEnv(
        rank=int(env.get("RANK", 0)),
        world_size=int(env.get("WORLD_SIZE", 1)),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
        run_id=env.get("TORCHELASTIC_RUN_ID"),
        restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", 0)),
    )


@dataclass
class World:
    """Rank, size, device and process group of this process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    group: dist.ProcessGroup | None = None  # None means the default group
    run_id: str | None = None

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier(group=self.group)

    def shutdown(self) -> None:
        if self.is_distributed and dist.is_initialized():
            dist.destroy_process_group()


def init_world(backend: str | None = None, timeout_s: float = 600.0, threads: int | None = None) -> World:
    """Start torch.distributed from torchrun's env: gloo on CPU, nccl on GPU.

    A single process without torchrun gets a non-distributed World (no process group).
    """
    env = read_launch_env()
    if threads:
        torch.set_num_threads(threads)
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    device = torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not env.under_torchrun:
        return World(device=device, run_id=env.run_id)
    backend = backend or ("nccl" if use_cuda else "gloo")
    if not dist.is_initialized() and env.agent_store:
        # The launcher's store outlives a restart (--max-restarts), and with it the last attempt's
        # gloo addresses: without a fresh prefix per attempt, connectFullMesh dials dead workers
        # ("Connection refused") and every restart fails.
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
        dist.init_process_group(backend=backend, store=dist.PrefixStore(f"decentrain/attempt{env.restart_count}", store),
                                rank=env.rank, world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    elif not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return World(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=env.local_rank,
        device=device,
        backend=backend,
        run_id=env.run_id,
    )
