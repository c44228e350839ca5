"""Shared-GPU efficiency variants for benchmarks/gpu_evidence.py: one arm's short run through the recipe's own
command line, replicas as threads (one CUDA context; the GIL serialises their Python) or as processes over
gloo (one context each, time-sliced by the GPU unless CUDA MPS runs; pair exchanges staged through host
memory), eager or compiled, at the arm's micro-batch or twice it (a step that speeds up by nearly 2x per token
is launch-bound). What four 25M replicas sharing one GPU are held back by is read from these rates.

A helper of gpu_evidence (as fault_tolerance_netns is of fault_tolerance), not a benchmark of its own: its
figures go in gpu_evidence's record. Each run is `python -m recipes.train` in its own process group, killed
whole at its time limit or when the benchmark is stopped (SIGTERM from the launch script's phase cap).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT

# name -> (replicas as, train.compile, micro-batch multiple, CUDA MPS)
VARIANTS = {
    "threads_eager": ("threads", "none", 1, False),  # the evidence runs' own setting
    "threads_blocks": ("threads", "blocks", 1, False),  # fewer, fused kernels per layer
    "processes_eager": ("processes", "none", 1, False),  # `decentrain compare`'s path: 4 CUDA contexts, gloo
    "processes_mps": ("processes", "none", 1, True),  # the same under CUDA MPS (only where the box has it)
    "threads_model": ("threads", "model", 1, False),  # whole-model compile
    "threads_eager_mb2x": ("threads", "none", 2, False),  # twice the tokens per step: is the step launch-bound?
}
DEFAULT_VARIANTS = ("threads_eager", "threads_blocks", "processes_eager", "processes_mps")


@dataclass(frozen=True)
class Batch:
    workers: int  # replicas sharing the GPU
    global_batch: int
    micro_batch: int


def merged(*groups: list[str]) -> list[str]:
    """Hydra overrides, a later one replacing an earlier one of the same key (Hydra refuses a key twice)."""
    out: dict[str, str] = {}
    for group in groups:
        for o in group:
            out[o.split("=", 1)[0]] = o
    return list(out.values())


def replica_rate(path: Path) -> float | None:
    """A replica's tokens/s: the median over its log windows, the first (warm-up, compilation) dropped."""
    from decentrain.core.metrics import read_jsonl

    rates = [r["perf/tokens_per_s"] for r in read_jsonl(path) if r.get("perf/tokens_per_s")] if path.exists() else []
    return statistics.median(rates[1:] if len(rates) > 1 else rates) if rates else None


def variant_overrides(base: list[str], name: str, batch: Batch) -> list[str]:
    """The recipe overrides of one variant: the arm's run with its execution, compile and batch."""
    how, scope, mult, _ = VARIANTS[name]
    layout = (
        ["transport=inprocess", f"transport.replicas={batch.workers}", "launcher.nproc_per_node=1"]
        if how == "threads"
        else [f"launcher.nproc_per_node={batch.workers}"]
    )
    return merged(
        base,
        layout,
        [
            f"train.compile={scope}",
            f"train.global_batch_size={batch.global_batch * mult}",
            f"train.micro_batch_size={batch.micro_batch * mult}",
        ],
    )


@contextlib.contextmanager
def mps_daemon(tmp: Path):
    """A private CUDA MPS control daemon for the variant's processes (its own pipe directory: nothing
    else on the box connects to it), quit afterwards. Yields the environment, or a reason it is not there."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if ctl is None:
        yield "nvidia-cuda-mps-control is not on this box"
        return
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp / "mps_pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp / "mps_log"),
    }
    for d in ("mps_pipe", "mps_log"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    start = subprocess.run([ctl, "-d"], env=env, capture_output=True, text=True, timeout=30)
    if start.returncode:
        yield f"nvidia-cuda-mps-control -d failed: {start.stderr.strip()[:200]}"
        return
    try:
        yield env
    finally:
        subprocess.run([ctl], input="quit\n", env=env, capture_output=True, text=True, timeout=30)


_GROUPS: set[int] = set()  # process groups of the recipe runs in flight


def stop_groups(signum, frame) -> None:
    """SIGTERM (the launch script's phase cap): take the running recipe's whole group down, then exit."""
    for pgid in list(_GROUPS):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def run_recipe(overrides: list[str], env: dict[str, str], timeout: float, log: Path) -> int | None:
    """`python -m recipes.train overrides` in its own process group, killed whole at `timeout` (None)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recipes.train", *overrides],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _GROUPS.add(proc.pid)
        try:
            return proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too
            proc.wait()
            return None
        finally:
            _GROUPS.discard(proc.pid)


def run_variant(
    name: str,
    overrides: Callable[[Path], list[str]],
    batch: Batch,
    flops_tok: float,
    peak: float | None,
    timeout: float,
    logs: Path,
) -> dict[str, Any]:
    """One variant: the recipe with `overrides(run_dir)` and the variant's layout; the GPU's tokens/s (every
    replica's steady rate, summed) and MFU, or why it has none (not on this box, timed out, failed)."""
    from decentrain.core.metrics import metrics_file

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"gpu_efficiency_{name}_") as tmp:
        with mps_daemon(Path(tmp)) if VARIANTS[name][3] else contextlib.nullcontext(dict(os.environ)) as env:
            if isinstance(env, str):
                return {"variant": name, "status": f"not run: {env}"}
            ovr = variant_overrides(overrides(Path(tmp) / "run"), name, batch)
            code = run_recipe(
                ovr, {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}, timeout, logs / f"{name}.log"
            )
        rates = [replica_rate(Path(tmp) / "run" / metrics_file(r)) for r in range(batch.workers)]
    wall = time.perf_counter() - t0
    if code != 0 or not all(rates):
        status = "timed out" if code is None else f"exit {code}" if code else "no throughput logged"
        return {"variant": name, "status": f"{status} (log {logs / f'{name}.log'})", "wall_s": wall}
    tps = sum(rates)
    return {
        "variant": name,
        "status": "ok",
        "tokens_per_s": tps,
        "mfu": tps * flops_tok / peak if peak else None,
        "wall_s": wall,
        "overrides": ovr,
    }


def variant_line(row: dict[str, Any]) -> str:
    """One variant's result as a line of the report."""
    if row["status"] != "ok":
        return f"{row['variant']:<19} {row['status']}"
    mfu = f"  MFU {row['mfu']:.1%}" if row.get("mfu") else ""
    return f"{row['variant']:<19} {row['tokens_per_s'] / 1e3:8.0f}k tok/s{mfu}  ({row['wall_s']:.0f}s with start-up)"
