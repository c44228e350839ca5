"""Start local (or multi-node) workers with torch's own launcher API when not under torchrun.

Collective algorithms (DDP, DiLoCo) use torch elastic: one failed worker stops them all,
and `max_restarts` restarts the group, which resumes from its last checkpoint. Gossip
algorithms (NoLoCo) must outlive a dead peer, which elastic cannot do (its agent tears
every worker down on one failure), so `launch_survivors` runs them with its own small
membership: this process hosts the c10d TCPStore (so any worker, rank 0 included, may
die without taking the store with it), starts the workers with torchrun's environment,
and waits for each alone. Over several hosts (`launcher=hosts`) the store is the job store
(core/comm/job_store.py), a process that runs no worker, and each host's launcher is its client:
a whole host may die, and a host started in its place heals its ranks from live peers.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from decentrain.core.comm.incarnation import SECRET_ENV, LauncherKey
from decentrain.core.comm.job_store import connect, parse_endpoint
from decentrain.core.world import Placement, plan_placement, read_launch_env, shared_store_prefix, visible_gpus

log = logging.getLogger(__name__)


def check_placement(device: str, nproc_per_node: int | None) -> Placement:
    """Refuse, before any worker starts, a device layout this node cannot serve (ValueError, one line).

    Under torchrun the node's local rank count comes from torchrun; otherwise from `nproc_per_node`.
    """
    env = read_launch_env()
    local_ranks = env.local_world_size if env.under_torchrun else (nproc_per_node or 1)
    return plan_placement(device, local_ranks, visible_gpus())


def launch_workers(
    argv: list[str],
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str = "localhost:0",
    max_restarts: int = 0,
    *,
    module: str,
    run_id: str | None = None,
) -> None:
    """Run `python -m <module> <argv>` on `nproc_per_node` ranks here, as torchrun would.

    Raises torch's ChildFailedError (with each failed rank's exit code) if a worker fails.
    """
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        run_id=run_id or uuid.uuid4().hex[:12],  # several nodes: the same on each (their rendezvous id)
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint,
        max_restarts=max_restarts,
        monitor_interval=0.2,
    )
    elastic_launch(config, entrypoint=sys.executable)("-u", "-m", module, *argv)


def stop_all(procs: Iterable[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM every process still running, then SIGKILL those not gone after `grace_s`."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            p.kill()


def exit_survivor() -> None:
    """Leave a finished, saved survivor worker without interpreter finalisation.

    A gossip worker may still hold a helper thread blocked in gloo on a dead partner (a receive
    or a pair rendezvous that never completes); the interpreter's exit would then end in
    std::terminate (SIGABRT) and the launcher would count a finished worker as failed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_on_ranks(fn: Callable[..., Any], nproc: int, *args: Any) -> dict[int, Any]:
    """Call `fn(*args)` on `nproc` local ranks under torch's launcher; returns {rank: result}.

    For benchmarks and tools that run a Python function (not a module) on several ranks.
    """
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.2,
    )
    return elastic_launch(config, fn)(*args)


@dataclass(frozen=True)
class HostSlot:
    """This host's place in a gossip job over several hosts (`launcher=hosts`)."""

    store: str  # HOST:PORT of the job store (core/comm/job_store.py), which runs no worker
    node_rank: int  # this host runs ranks node_rank * nproc ... node_rank * nproc + nproc - 1
    nnodes: int
    job_id: str  # the same on every host of the job


def launch_survivors(
    argv: list[str],
    nproc: int,
    run_dir: str | os.PathLike | None = None,
    *,
    module: str,
    host: str = "127.0.0.1",
    max_restarts: int = 0,
    poll_s: float = 0.2,
    slot: HostSlot | None = None,
) -> dict[int, int]:
    """Run `python -m <module> <argv>` on `nproc` local ranks that survive each other's death.

    A worker that fails is started again, up to `max_restarts` times per rank, as a replacement
    with a higher incarnation (`DECENTRAIN_INCARNATION`): it joins no world-wide group and heals
    from a live peer (see NoLoCo). It is not restarted once no other worker is left to heal from.
    Returns {rank: last exit code}. Raises RuntimeError when no worker finished. With `run_dir`,
    writes `<run_dir>/workers.json` ({rank: pid}, rewritten on each restart) so an operator (or
    a fault benchmark) can find, stop or kill one worker.

    One host (`slot` None): this process hosts the store. Several (`slot`): this is one host's
    launcher, a client of the job store; its ranks take the next incarnation the store hands
    out, so a host started in place of a dead one (same node_rank) starts replacements that heal.
    If the job store goes, the workers are stopped and RuntimeError says so.
    """
    if slot is None:
        store = TCPStore(host, 0, is_master=True, wait_for_workers=False)  # lives as long as this launcher
        addr, port, run_id, first, world = host, store.port, uuid.uuid4().hex[:12], 0, nproc
        key = LauncherKey.from_env()
    else:
        key = LauncherKey.from_env(required=True)  # every host signs with the job's key
        store, (addr, port) = connect(slot.store), parse_endpoint(slot.store)
        run_id, first, world = slot.job_id, slot.node_rank * nproc, slot.nnodes * nproc
    shared = PrefixStore(shared_store_prefix(0), store)  # workers' World.store (TORCHELASTIC_RESTART_COUNT=0)
    procs: dict[int, subprocess.Popen] = {}
    incarnation: dict[int, int] = {}
    restarts = {rank: 0 for rank in range(first, first + nproc)}

    def claim(rank: int) -> str:
        # the launchers' signed record of who they started: donors serve heal requests only from these
        incarnation[rank], token = key.claim(shared, run_id, rank)
        return token

    def start(rank: int, token: str) -> None:
        env = {
            **os.environ,
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank - first),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(first // nproc),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "DECENTRAIN_INCARNATION": str(incarnation[rank]),
            **key.worker_env(run_id, token),
        }
        env.pop(SECRET_ENV, None)  # the launchers' secret stays with them
        procs[rank] = subprocess.Popen([sys.executable, "-u", "-m", module, *argv], env=env)
        if run_dir is not None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / workers_file(slot)).write_text(json.dumps({str(r): p.pid for r, p in procs.items()}))

    codes: dict[int, int] = {}
    try:
        tokens = {rank: claim(rank) for rank in restarts}  # all before any worker: a claim that fails starts none
        for rank, token in tokens.items():
            start(rank, token)
        while len(codes) < nproc:
            time.sleep(poll_s)
            check_store(store, addr, port)
            for rank, p in list(procs.items()):
                code = p.poll()
                if code is None or rank in codes:
                    continue
                running = [r for r, q in procs.items() if r != rank and q.poll() is None]
                # on one host a replacement needs a live local peer; on several, peers may live elsewhere
                if code != 0 and restarts[rank] < max_restarts and (running or slot is not None):
                    restarts[rank] += 1
                    log.warning(
                        "rank %d failed (%s); starting replacement %d of %d",
                        rank,
                        describe_exits({rank: code}),
                        restarts[rank],
                        max_restarts,
                    )
                    try:
                        start(rank, claim(rank))
                    except RuntimeError as e:  # no record could be claimed: this rank stays down, the others run on
                        log.warning("rank %d: no replacement started (%s)", rank, (str(e).splitlines() or [""])[0])
                        codes[rank] = code
                else:
                    codes[rank] = code
                    if code != 0:  # said when it happens, not only in the summary at the end
                        log.warning(
                            "worker died (%s); %d worker(s) still running, its partners skip it from their next round",
                            describe_exits({rank: code}),
                            len(running),
                        )
    except BaseException:  # Ctrl-C, a kill of the launcher, the job store gone: take the workers down with it
        stop_all(procs.values())
        raise
    failed = {r: c for r, c in codes.items() if c != 0}
    if len(failed) == nproc:
        raise RuntimeError(f"every worker failed: exit codes {describe_exits(failed)}")
    replaced = {r: i for r, i in incarnation.items() if i}
    if replaced:
        log.warning("replaced: %s", ", ".join(f"rank {r} x{i}" for r, i in sorted(replaced.items())))
    if failed:
        log.warning("%d of %d workers finished; failed: %s", nproc - len(failed), nproc, describe_exits(failed))
    return codes


def workers_file(slot: HostSlot | None) -> str:
    """`workers.json` on one host; `workers.node<K>.json` per host of a multi-host job (a shared run dir)."""
    return "workers.json" if slot is None else f"workers.node{slot.node_rank}.json"


def check_store(store: TCPStore, addr: str, port: int) -> None:
    """RuntimeError (one line) if the job store no longer answers."""
    try:
        store.check(["launcher/alive"])
    except (RuntimeError, OSError) as e:  # DistNetworkError is a RuntimeError
        first_line = (str(e).splitlines() or ["no answer"])[0]
        raise RuntimeError(
            f"the job store at {addr}:{port} is gone ({first_line}); stopped this host's workers: "
            "start the job store and the job again with resume=true to continue from the last checkpoints"
        ) from e


def describe_exits(codes: dict[int, int]) -> str:
    """`rank 3: SIGKILL, rank 1: exit 2` (Popen gives -N for a worker killed by signal N)."""
    return ", ".join(f"rank {r}: {signal.Signals(-c).name if c < 0 else f'exit {c}'}" for r, c in sorted(codes.items()))
