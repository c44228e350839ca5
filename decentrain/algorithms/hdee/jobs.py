"""Independent HDEE jobs on this machine: one OS process (or torchrun group) per seed or lane.

Experts never communicate, so the jobs share nothing but the ensemble directory. On a
cluster the same split is a Hydra multirun over `job.index` (e.g. the submitit
launcher); here we start `max_parallel` of them at a time and wait for all.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from decentrain.algorithms.hdee.config import HdeeConfig
from decentrain.algorithms.hdee.train import model_dir

# Overrides the parent sets for each child; the user's own values for these are dropped.
_JOB_KEYS = ("job.stage", "job.index", "ensemble_dir", "hydra.run.dir")

log = logging.getLogger(__name__)


@dataclass
class Job:
    name: str
    argv: list[str]
    log: Path


def child_jobs(cfg: HdeeConfig, stage: str, overrides: list[str], module: str) -> list[Job]:
    """One job per seed (stage='seed') or per lane (stage='lane'), re-entering `module`.

    Seeds and lanes whose final model is already saved get no job (a process start costs seconds).
    """
    if stage not in ("seed", "lane"):
        raise ValueError(f"stage={stage!r} must be 'seed' or 'lane'")
    root = Path(cfg.ensemble_dir).resolve()
    keep = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in _JOB_KEYS]
    count = len(cfg.plan.seeds) if stage == "seed" else cfg.plan.num_experts
    names = [s.name for s in cfg.plan.seeds] if stage == "seed" else [f"lane{i}" for i in range(count)]
    finals = names if stage == "seed" else cfg.plan.final_experts()
    return [
        Job(
            names[i],
            [
                sys.executable,
                "-u",
                "-m",
                module,
                *keep,
                f"job.stage={stage}",
                f"job.index={i}",
                f"ensemble_dir={root}",
                f"hydra.run.dir={root}",
            ],
            root / "logs" / f"{names[i]}.log",
        )
        for i in range(count)
        if not model_dir(root, finals[i]).exists()
    ]


def run_jobs(jobs: list[Job], max_parallel: int, poll_s: float = 0.5) -> None:
    """Run `jobs` as separate processes, at most `max_parallel` at once; raise naming every failure."""
    pending, running, failed = list(jobs), [], []
    while pending or running:
        while pending and len(running) < max_parallel:
            job = pending.pop(0)
            job.log.parent.mkdir(parents=True, exist_ok=True)
            with open(job.log, "w") as out:
                running.append((job, subprocess.Popen(job.argv, stdout=out, stderr=subprocess.STDOUT)))
            log.info(f"[hdee] started job {job.name} (log {job.log})")
        for job, proc in list(running):
            if proc.poll() is None:
                continue
            running.remove((job, proc))
            if proc.returncode:
                failed.append((job, proc.returncode))
            log.info(f"[hdee] job {job.name} exited with {proc.returncode}")
        time.sleep(poll_s)
    if failed:
        details = "\n".join(f"--- {j.name} (exit {rc}), last lines of {j.log}:\n{_tail(j.log)}" for j, rc in failed)
        raise RuntimeError(f"{len(failed)} of {len(jobs)} jobs failed: {[j.name for j, _ in failed]}\n{details}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
