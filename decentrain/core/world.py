"""The one place that reads the launcher's environment (torchrun's, or Slurm's under submitit)
and starts torch.distributed.

Everything else receives a `World` explicitly: there are no module-level globals.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

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
    incarnation: int = 0  # launch_survivors: how often this rank was restarted (a replacement has > 0)
    slurm_task: bool = False  # a task of a submitit Slurm job (returns its result to submitit on exit)

    @property
    def under_torchrun(self) -> bool:
        """Started as one rank of a world (torchrun, our launchers, or a Slurm task under submitit)."""
        return self.run_id is not None or "RANK" in os.environ


def shared_store_prefix(restart_count: int) -> str:
    """Where `World.store` lives in the job's c10d store (the launcher writes its records there too)."""
    return f"decentrain/attempt{restart_count}/shared"


def read_launch_env() -> LaunchEnv:
    env = os.environ
    if "RANK" not in env and is_submitit_slurm_task(env):
        return slurm_launch_env(env)
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
        incarnation=int(env.get("DECENTRAIN_INCARNATION", 0)),
    )


def is_submitit_slurm_task(env: "os._Environ[str] | dict[str, str]") -> bool:
    """One of several tasks of a Slurm job that submitit submitted (Hydra's submitit launcher).

    A one-task job is not a world: there the recipe may start local workers itself, as before.
    Plain Slurm jobs (an sbatch script, `srun` in an allocation) go through torchrun instead.
    """
    return env.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", 1)) > 1


def slurm_launch_env(env: "os._Environ[str] | dict[str, str]") -> LaunchEnv:
    """Slurm's task layout as torchrun's: one task is one rank, rank 0 (on the step's first node) hosts the store."""
    node = int(env.get("SLURM_NODEID", 0))
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1"))
    job = env.get("SLURM_JOB_ID", "0")
    return LaunchEnv(
        rank=int(env["SLURM_PROCID"]),
        world_size=int(env["SLURM_NTASKS"]),
        local_rank=int(env.get("SLURM_LOCALID", 0)),
        local_world_size=per_node[node] if node < len(per_node) else per_node[-1],
        run_id=f"slurm-{job}",
        restart_count=int(env.get("SLURM_RESTART_COUNT", 0)),
        master_addr=env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]),
        # one port per job, as launch/slurm.sbatch does: jobs sharing a node must not share a store
        master_port=int(env.get("MASTER_PORT") or 20000 + int(job) % 30000),
        slurm_task=True,
    )


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed counts, e.g. `2(x3),1` -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in spec.split(","):
        count, _, rep = part.partition("(x")
        out += [int(count)] * (int(rep.rstrip(")")) if rep else 1)
    return out


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: `gpu[07-09,12],cpu1` -> `gpu07` (as `scontrol show hostnames | head -1`)."""
    prefix, bracket, rest = nodelist.partition("[")
    if "," in prefix or not bracket:
        return prefix.split(",")[0]
    ranges, _, suffix = rest.partition("]")
    return prefix + ranges.split(",")[0].split("-")[0] + suffix.split(",")[0]


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
    # the job's shared c10d key-value store (gossip membership and heal rendezvous live under it);
    # None without torch.distributed
    store: dist.Store | None = field(default=None, repr=False, compare=False)
    # opens another client of that store: a blocking wait on one client (a rendezvous) holds its
    # lock, so whatever may wait long gets a connection of its own
    store_client: Callable[..., dist.Store] | None = field(default=None, repr=False, compare=False)
    # >0: this process replaces a dead worker of the same rank. It has the store but no world
    # process group: it skips start-up collectives and heals from a live peer instead
    incarnation: int = 0
    # local ranks sharing this rank's GPU (round-robin placement): each gets ~1/share of its peak FLOP/s
    device_share: int = 1
    # gossip jobs this process started in this group, counted here: a count in the store moves with
    # any client's write (core/comm/membership.job_number)
    gossip_jobs: int = field(default=0, repr=False, compare=False)

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


DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Placement:
    """Where the local ranks of one node run, and which backend their process group uses.

    More local ranks than GPUs: ranks share GPUs round-robin (cuda:local_rank % gpus). NCCL
    refuses two ranks on one GPU, so a shared node talks over gloo through host memory.
    """

    device_type: str  # "cpu" | "cuda"
    gpus: int  # visible GPUs used (0 on cpu)
    shared: bool  # several local ranks per GPU
    backend: str

    def device(self, local_rank: int) -> torch.device:
        return torch.device("cuda", local_rank % self.gpus) if self.device_type == "cuda" else torch.device("cpu")

    def share(self, local_rank: int, local_ranks: int) -> int:
        """How many of the `local_ranks` ranks run on `local_rank`'s device (1 on CPU: no shared peak)."""
        return len(range(local_rank % self.gpus, local_ranks, self.gpus)) if self.device_type == "cuda" else 1


def plan_placement(device: str, local_ranks: int, gpus: int, backend: str | None = None) -> Placement:
    """Resolve `device` (auto|cpu|cuda) for `local_ranks` ranks on a node with `gpus` visible GPUs.

    Raises ValueError (one line, naming the counts and the fix) for a layout the code cannot serve.
    """
    if device not in DEVICES:
        raise ValueError(f"train.device={device!r} is unknown; allowed: {list(DEVICES)}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; allowed: {list(BACKENDS)}")
    if local_ranks < 1:
        raise ValueError(f"local ranks={local_ranks} must be >= 1")
    if device == "cuda" and gpus < 1:
        raise ValueError(
            f"train.device=cuda but no CUDA GPU is visible to {local_ranks} local rank(s) "
            "(torch.cuda.device_count()=0); set train.device=cpu or auto, or check CUDA_VISIBLE_DEVICES"
        )
    if device == "cpu" or (device == "auto" and gpus < 1):
        if backend == "nccl":
            raise ValueError(
                f"backend nccl needs CUDA, but {local_ranks} local rank(s) run on cpu "
                f"(train.device={device}, {gpus} GPU(s) visible); use backend gloo or train.device=cuda"
            )
        return Placement("cpu", 0, False, "gloo")
    shared = local_ranks > gpus
    if shared and backend == "nccl":
        raise ValueError(
            f"backend nccl cannot put {local_ranks} local ranks on {gpus} GPU(s) (one rank per GPU); "
            f"start at most {gpus} rank(s) per node, or use gloo (the default when ranks share GPUs)"
        )
    return Placement("cuda", min(gpus, local_ranks), shared, backend or ("gloo" if shared else "nccl"))


def tag_log_records(rank: int) -> None:
    """Every log record of this process starts with its rank: one process is one rank, and logging's
    handlers are process-wide, so the record factory is where the rank can go once for all modules."""
    base = logging.getLogRecordFactory()
    base = getattr(base, "untagged", base)  # a second World in one process re-tags, never stacks

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = base(*args, **kwargs)
        # not `record.rank`: a record with `extra={"rank": ...}` (torchft's commit/quorum logs) would collide
        record.process_rank = rank
        record.msg = f"[rank {rank}] {record.msg}"
        return record

    factory.untagged = base  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def init_world(
    backend: str | None = None, timeout_s: float = 600.0, threads: int | None = None, device: str = "auto"
) -> World:
    """Start torch.distributed from torchrun's env on the device `plan_placement` picks.

    Default backend: nccl with one rank per GPU, gloo on CPU or when local ranks share GPUs.
    A single process without torchrun gets a non-distributed World (no process group).
    """
    env = read_launch_env()
    if threads:
        torch.set_num_threads(threads)
    # an explicit gloo backend with device=auto keeps the old meaning: CPU tensors
    device = "cpu" if backend == "gloo" and device == "auto" else device
    placement = plan_placement(device, env.local_world_size, visible_gpus(), backend)
    dev = placement.device(env.local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    tag_log_records(env.rank)
    if not env.under_torchrun:
        return World(device=dev, run_id=env.run_id, device_share=placement.share(env.local_rank, env.local_world_size))
    backend = placement.backend
    store = store_client = None
    if not dist.is_initialized():
        # the store is created here (not inside init_process_group) so that World can hand it on:
        # gossip membership and per-pair groups of replacements are keyed in it
        if env.agent_store:  # the launcher hosts it and it outlives any worker
            raw = dist.TCPStore(
                env.master_addr, env.master_port, env.world_size, is_master=False, timeout=timedelta(seconds=timeout_s)
            )
        else:  # plain env://: rank 0 hosts it, as init_process_group would
            raw = dist.TCPStore(
                env.master_addr,
                env.master_port,
                env.world_size,
                is_master=env.rank == 0,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        # The launcher's store outlives a restart (--max-restarts), and with it the last attempt's
        # gloo addresses: without a fresh prefix per attempt, connectFullMesh dials dead workers
        # ("Connection refused") and every restart fails.
        attempt = f"decentrain/attempt{env.restart_count}"
        store = dist.PrefixStore(shared_store_prefix(env.restart_count), raw)
        if env.incarnation == 0:  # a replacement cannot join the world group (gloo's cannot take a new member)
            dist.init_process_group(
                backend=backend,
                store=dist.PrefixStore(attempt, raw) if env.agent_store else raw,
                rank=env.rank,
                world_size=env.world_size,
                timeout=timedelta(seconds=timeout_s),
            )

        def store_client(timeout: float = timeout_s) -> dist.Store:  # a short timeout bounds a reconnect too
            client = dist.TCPStore(
                env.master_addr, env.master_port, is_master=False, timeout=timedelta(seconds=timeout)
            )
            return dist.PrefixStore(shared_store_prefix(env.restart_count), client)

    return World(
        rank=dist.get_rank() if dist.is_initialized() else env.rank,
        world_size=dist.get_world_size() if dist.is_initialized() else env.world_size,
        local_rank=env.local_rank,
        device=dev,
        backend=placement.backend,
        run_id=env.run_id,
        store=store,
        store_client=store_client,
        incarnation=env.incarnation,
        device_share=placement.share(env.local_rank, env.local_world_size),
    )


def local_world(device: str = "auto", threads: int | None = None) -> World:
    """A non-distributed World on the resolved device (a stand-alone peer, e.g. a hivemind SAPO node)."""
    if threads:
        torch.set_num_threads(threads)
    env = read_launch_env()
    placement = plan_placement(device, env.local_world_size, visible_gpus())
    dev = placement.device(env.local_rank)
    tag_log_records(env.rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return World(device=dev, run_id=env.run_id, device_share=placement.share(env.local_rank, env.local_world_size))
