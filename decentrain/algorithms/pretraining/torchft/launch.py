"""Start `transport.replicas` replica groups on this machine, each its own torchrun job, and a
torchft Lighthouse that joins them (`transport=torchft`, transports/torchft_groups.py).

A group is `python -m torch.distributed.run --standalone --max-restarts N`: when one of its
ranks dies, torchrun restarts that group alone (the others keep training, see torchft's
Manager) and the restarted group heals from a live one at its next quorum. Each group
writes its own run directory, `<run_dir>/replica_<i>` (checkpoints stay per group, for
whole-job restarts). `<run_dir>/replicas.json` lists each group's torchrun pid, so an
operator (or benchmarks/fault_tolerance.py) can find a group's workers.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from decentrain.core.launch.launcher import stop_all

log = logging.getLogger(__name__)

_OWN_KEYS = ("run_dir=", "hydra.run.dir=", "transport.replica_id=", "transport.lighthouse=")


def start_lighthouse(options: dict[str, int]):
    """torchft's Rust Lighthouse in this process (torchft.coordination.LighthouseServer; `options`:
    TorchFTConfig.lighthouse_options)."""
    from torchft.coordination import LighthouseServer

    return LighthouseServer(bind="[::]:0", **options)


def replica_group_command(
    argv: list[str],
    replica_id: int,
    nproc: int,
    run_dir: str,
    lighthouse: str,
    max_restarts: int,
    module: str = "recipes.train",
) -> list[str]:
    """The torchrun line of one replica group (what launch/torchft_replica.sh runs on another host)."""
    own = [a for a in argv if not a.startswith(_OWN_KEYS)]
    group_dir = str(Path(run_dir) / f"replica_{replica_id}")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.2",
        "-m",
        module,
        *own,
        f"run_dir={group_dir}",
        f"hydra.run.dir={group_dir}",
        f"transport.replica_id={replica_id}",
        f"transport.lighthouse={lighthouse}",
    ]


def launch_replica_groups(
    argv: list[str],
    replicas: int,
    nproc: int,
    run_dir: str,
    address: str | None,
    lighthouse_options: dict[str, int],
    max_restarts: int = 0,
    module: str = "recipes.train",
    poll_s: float = 0.2,
) -> dict[int, int]:
    """Run the replica groups to the end; returns {replica_id: exit code}. RuntimeError if none finished.

    `address`: a running lighthouse's; None starts one here with `lighthouse_options`."""
    lighthouse = None
    if address is None:
        lighthouse = start_lighthouse(lighthouse_options)
        address = lighthouse.address()
    log.info("torchft lighthouse %s; %d replica groups of %d ranks", address, replicas, nproc)
    procs = {
        i: subprocess.Popen(
            replica_group_command(argv, i, nproc, run_dir, address, max_restarts, module),
            env={"RUST_LOG": "warn", **os.environ, "PYTHONUNBUFFERED": "1"},
        )
        for i in range(replicas)
    }
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "replicas.json").write_text(
        json.dumps({"lighthouse": address, "torchrun": {str(i): p.pid for i, p in procs.items()}})
    )
    last = replicas - 1
    log.info(
        "to see a group die, restart and heal, kill group %d's workers (its torchrun restarts them): "
        "pkill -KILL -P %d   (every group's torchrun pid: %s)",
        last,
        procs[last].pid,
        Path(run_dir) / "replicas.json",
    )
    try:
        while any(p.poll() is None for p in procs.values()):
            time.sleep(poll_s)
    except BaseException:  # Ctrl-C or a kill of the launcher: take the groups down with it
        stop_all(procs.values())
        raise
    finally:
        if lighthouse is not None:
            lighthouse.shutdown()
    codes = {i: p.returncode for i, p in procs.items()}
    for i, c in sorted(codes.items()):
        if c != 0:
            log.warning(
                "replica group %d failed for good (exit %d): torchrun's --max-restarts=%d used up", i, c, max_restarts
            )
    failed = {i: c for i, c in codes.items() if c != 0}
    if len(failed) == replicas:
        raise RuntimeError(f"every replica group failed: exit codes {failed}")
    if failed:
        log.warning("%d of %d replica groups finished; failed: %s", replicas - len(failed), replicas, failed)
    return codes
