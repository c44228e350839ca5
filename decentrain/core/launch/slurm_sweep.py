"""Hydra sweeps on Slurm: the request is checked before anything is queued.

Each sweep point is one Slurm job of `nodes x tasks_per_node` tasks; every task is one rank of
that point's world (`core/world.py` maps submitit's Slurm environment to torchrun's). Before
submitting, `sbatch --test-only` asks the controller whether the request can ever run: a
request no node can hold fails here with Slurm's reason instead of pending forever while the
sweep waits silently. The launcher itself (a Hydra plugin must live in the `hydra_plugins`
package) is `hydra_plugins/decentrain_slurm`.
"""

from __future__ import annotations

import logging
import subprocess
from typing import Any

log = logging.getLogger(__name__)

# submitit parameter -> sbatch flag, for the resources that decide whether a job fits
SBATCH_FLAGS = {
    "nodes": "--nodes",
    "tasks_per_node": "--ntasks-per-node",
    "cpus_per_task": "--cpus-per-task",
    "gpus_per_node": "--gpus-per-node",
    "gpus_per_task": "--gpus-per-task",
    "cpus_per_gpu": "--cpus-per-gpu",
    "mem_per_cpu": "--mem-per-cpu",
    "mem_per_gpu": "--mem-per-gpu",
    "partition": "--partition",
    "qos": "--qos",
    "account": "--account",
    "constraint": "--constraint",
    "exclude": "--exclude",
    "gres": "--gres",
    "timeout_min": "--time",
}


def sbatch_test_args(params: dict[str, Any]) -> list[str]:
    """The sbatch flags of a submitit launcher config (Hydra's `hydra.launcher` section)."""
    args = [f"{flag}={params[key]}" for key, flag in SBATCH_FLAGS.items() if params.get(key) not in (None, "")]
    if params.get("mem_gb"):
        args.append(f"--mem={params['mem_gb']}G")
    args += [f"--{k.replace('_', '-')}={v}" for k, v in (params.get("additional_parameters") or {}).items()]
    return args


def check_schedulable(params: dict[str, Any]) -> str:
    """Ask Slurm (`sbatch --test-only`) whether the request fits any node; RuntimeError with its reason if not."""
    cmd = ["sbatch", "--test-only", *sbatch_test_args(params), "--wrap", "true"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        raise RuntimeError("hydra/launcher=slurm: sbatch is not on PATH (run the sweep on a Slurm login node)") from e
    reply = (out.stderr or out.stdout).strip().splitlines()
    if out.returncode != 0:
        raise RuntimeError(
            f"hydra/launcher=slurm: Slurm cannot schedule {' '.join(cmd[2:-2])}: "
            f"{reply[-1] if reply else 'sbatch --test-only failed'} "
            "(set hydra.launcher.{cpus_per_task,mem_gb,gpus_per_node,tasks_per_node,partition} to what a node has)"
        )
    return reply[-1] if reply else ""
