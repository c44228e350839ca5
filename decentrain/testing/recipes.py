"""Run a recipe as a user would (`python -m recipes.<name> overrides...`), on a tiny model.

One runner for every recipe: `run_recipe(module, *overrides)`; `run_train` is the pre-training
recipe on the tiny model below, and `recipe_killing_a_worker` starts it and SIGKILLs one worker
once the run reached a state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def _checkout() -> Path:
    """The checkout whose recipes/ and conf/ the recipes run from: this package's, in an editable install."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "recipes").is_dir() else Path.cwd()


ROOT = _checkout()

# recipes.train on a tiny model and corpus
TINY = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "data.seq_len=32",
    "data.max_bytes_per_domain=20000",
    "data.domains=[python_docs,licenses]",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "train.eval_batches=1",
    "logger.log_every=1",
    "logger.progress=false",
    "train.threads=1",
]
# recipes.rl on a tiny model (recipes.sft takes those without loss./train.)
TINY_RL = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.intermediate_size=64",
    "model.num_heads=4",
    "sampling.max_new_tokens=4",
    "loss.num_generations=4",
    "train.micro_batch_size=16",
    "train.threads=1",
    "task.size=100",
    "logger.progress=false",
]


def recipe_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, offline and one thread per process, plus `env`."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", **(env or {})}


def recipe_command(module: str, *overrides: str) -> list[str]:
    return [sys.executable, "-m", module, *overrides]


def run_recipe(
    module: str, *overrides: str, ok: bool = True, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m <module> <overrides>` from the checkout; assert it succeeded (or failed, with ok=False)."""
    proc = subprocess.run(
        recipe_command(module, *overrides),
        cwd=ROOT,
        env=recipe_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def run_train(
    run_dir: Path, *overrides: str, ok: bool = True, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """recipes.train on the tiny model, writing to `run_dir`."""
    return run_recipe("recipes.train", *TINY, f"run_dir={run_dir}", *overrides, ok=ok, timeout=timeout, env=env)


def recipe_killing_a_worker(
    run_dir: Path,
    *overrides: str,
    ready: Callable[[], bool],
    victim: Callable[[], int | None],
    env: dict[str, str] | None = None,
    wait_s: float = 180,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Start recipes.train on the tiny model, SIGKILL the worker `victim()` names once `ready()` holds, let it end.

    A run that ends, or is not ready within `wait_s`, fails here with its output: killing at another
    moment would test something else.

    Returns the run (stdout and stderr together in `stdout`); the caller asserts on it. The recipe runs in its
    own process group, so the cleanup reaches every worker whatever happens.
    """
    args = recipe_command("recipes.train", *TINY, f"run_dir={run_dir}", *overrides)
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=recipe_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + wait_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(
                    f"the run was not ready to lose a worker (exit {proc.poll()}, "
                    f"{wait_s} s):\n{proc.communicate()[0][-3000:]}"
                )
            time.sleep(0.2)  # polls a state (ready()); the wait ends on it, not on the time
        pid = victim()
        assert pid is not None, "found no worker to kill"
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(args, proc.returncode, out)


def worker_ready(run_dir: Path, step: int) -> bool:
    """Rank 0 has logged `step` and the launcher has listed its workers (`workers.json`): a worker can be killed."""
    rows = metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    return any(r.get("step", 0) >= step for r in rows) and (run_dir / "workers.json").exists()


def metrics(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    """The rows of a run's metrics file; a line still being written (a live run) is left out."""
    rows = []
    for line in (run_dir / name).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in metrics(run_dir) if "train/loss" in r}
