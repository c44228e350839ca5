"""Start local (or multi-node) workers with torch's own launcher API when not under torchrun.

Collective algorithms (DDP, DiLoCo) use torch elastic: one failed worker stops them all,
and `max_restarts` restarts the group, which resumes from its last checkpoint. Gossip
algorithms (NoLoCo) must outlive a dead peer, which elastic cannot do (its agent tears
every worker down on one failure), so `launch_survivors` runs them with its own small
membership: this process hosts the c10d TCPStore (so any worker, rank 0 included, may
die without taking the store with it), starts the workers with torchrun's environment,
and waits for each alone.
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
from pathlib import Path
from typing import Any, Callable, Iterable

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from decentrain.core.launch_config import LauncherConfig
from decentrain.core.membership import INCARNATION_KEY
from decentrain.core.world import Placement, plan_placement, read_launch_env, shared_store_prefix, visible_gpus

log = logging.getLogger(__name__)


def check_placement(device: str, nproc_per_node: int | None) -> Placement:
    """Refuse, before any worker starts, a device layout this node cannot serve (ValueError, one line).

    Under torchrun the node's local rank count comes from torchrun; otherwise from `nproc_per_node`.
    """
    env = read_launch_env()
    local_ranks = env.local_world_size if env.under_torchrun else (nproc_per_node or 1)
    return plan_placement(device, local_ranks, visible_gpus())


def launch_workers(argv: list[str], nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str = "localhost:0",
                   max_restarts: int = 0, *, module: str) -> None:
    """Run `python -m <module> <argv>` on `nproc_per_node` ranks here, as torchrun would.

    Raises torch's ChildFailedError (with each failed rank's exit code) if a worker fails.
    """
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint,
        max_restarts=max_restarts,
        monitor_interval=0.2,
    )
    elastic_launch(config, entrypoint=sys.executable)("-u", "-m", module, *argv)


def launch_job(argv: list[str], cfg: LauncherConfig, *, module: str, run_dir: str | os.PathLike,
               survivors: bool) -> None:
    """Start one job's `launcher.nproc_per_node` workers (`python -m <module> <argv>`) and wait for them.

    `survivors` (the algorithm's `survives_peer_loss`) on one node: `launch_survivors`, so a dead
    worker costs its partners a round, not the job; RuntimeError when no worker finished. Otherwise
    torch elastic (`launch_workers`): one failure stops all, `max_restarts` restarts the group.
    """
    if survivors and cfg.nnodes == 1:
        launch_survivors(argv, cfg.nproc_per_node, run_dir, module=module, max_restarts=cfg.max_restarts)
    else:
        launch_workers(argv, cfg.nproc_per_node, cfg.nnodes, cfg.rdzv_endpoint, cfg.max_restarts, module=module)


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
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex[:12],
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2)
    return elastic_launch(config, fn)(*args)


def launch_survivors(argv: list[str], nproc: int, run_dir: str | os.PathLike | None = None, *, module: str,
                     host: str = "127.0.0.1", max_restarts: int = 0, poll_s: float = 0.2) -> dict[int, int]:
    """Run `python -m <module> <argv>` on `nproc` local ranks that survive each other's death.

    A worker that fails is started again, up to `max_restarts` times per rank, as a replacement
    with a higher incarnation (`DECENTRAIN_INCARNATION`): it joins no world-wide group and heals
    from a live peer (see NoLoCo). It is not restarted once no other worker is left to heal from.
    Returns {rank: last exit code}. Raises RuntimeError when no worker finished. With `run_dir`,
    writes `<run_dir>/workers.json` ({rank: pid}, rewritten on each restart) so an operator (or
    a fault benchmark) can find, stop or kill one worker.
    """
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False)  # lives as long as this launcher
    run_id = uuid.uuid4().hex[:12]
    shared = PrefixStore(shared_store_prefix(0), store)  # workers' World.store (TORCHELASTIC_RESTART_COUNT=0)
    procs: dict[int, subprocess.Popen] = {}
    incarnation = {rank: 0 for rank in range(nproc)}

    def start(rank: int) -> None:
        # The launcher's record of who it restarted: donors serve heal requests only from these.
        shared.set(f"{INCARNATION_KEY}/{rank}", str(incarnation[rank]))
        env = {**os.environ, "MASTER_ADDR": host, "MASTER_PORT": str(store.port), "RANK": str(rank),
               "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
               "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
               "DECENTRAIN_INCARNATION": str(incarnation[rank])}
        procs[rank] = subprocess.Popen([sys.executable, "-u", "-m", module, *argv], env=env)
        if run_dir is not None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            (Path(run_dir) / "workers.json").write_text(json.dumps({str(r): p.pid for r, p in procs.items()}))

    for rank in range(nproc):
        start(rank)
    codes: dict[int, int] = {}
    try:
        while len(codes) < nproc:
            time.sleep(poll_s)
            for rank, p in list(procs.items()):
                code = p.poll()
                if code is None or rank in codes:
                    continue
                alive = [r for r, q in procs.items() if r != rank and q.poll() is None]
                if code != 0 and incarnation[rank] < max_restarts and alive:
                    incarnation[rank] += 1
                    log.warning("rank %d failed (%s); starting replacement %d of %d", rank,
                                describe_exits({rank: code}), incarnation[rank], max_restarts)
                    start(rank)
                else:
                    codes[rank] = code
                    if code != 0:  # said when it happens, not only in the summary at the end
                        log.warning("worker died (%s); %d worker(s) still running, its partners skip it from their "
                                    "next round", describe_exits({rank: code}), len(alive))
    except BaseException:  # Ctrl-C or a kill of the launcher: take the workers down with it
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


def describe_exits(codes: dict[int, int]) -> str:
    """`rank 3: SIGKILL, rank 1: exit 2` (Popen gives -N for a worker killed by signal N)."""
    return ", ".join(f"rank {r}: {signal.Signals(-c).name if c < 0 else f'exit {c}'}" for r, c in sorted(codes.items()))
