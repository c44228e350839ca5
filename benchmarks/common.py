"""Pieces several benchmarks share, so no benchmark imports another's helpers.

Each lives here because two or more scripts use it; a piece one script uses stays in that script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a recipe run by a benchmark: offline, one thread per process (the benchmark decides the parallelism)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}


# -- the model of the wire (comm_sync, noloco_convergence) -------------------------------
def wire(method: str, n: int, nbytes: int) -> tuple[float, float]:
    """(messages in sequence, bytes each node uploads) for one sync of `nbytes` (what is reduced)."""
    if method.startswith("pair"):
        return 1.0, float(nbytes)
    return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes  # ring reduce-scatter + all-gather


# -- recipes as subprocesses (sapo_swarm, sapo_learning) ---------------------------------
def run_module(module: str, overrides: list[str]) -> float:
    """`python -m module overrides...` from the repository root; its wall seconds (raises with its output tail)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", module, *overrides], cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{module} {overrides} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - t0


def round_rows(path: Path) -> list[dict]:
    """One row per round: a resumed run re-logs rounds after its checkpoint, so the last row wins."""
    rows: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
            rows[int(r["step"])] = r
        except (ValueError, KeyError, TypeError):
            continue
    return [rows[k] for k in sorted(rows)]


def prompt_as_is_tokenizer(model_dir: Path):
    """The warm start's tokenizer for TRL (sapo_round_time, sapo_learning): TRL tokenizes plain prompts with
    special tokens, where ByT5 would append </s>; the node does not, so this one adds none."""
    from transformers import AutoTokenizer

    class PromptAsIs(type(AutoTokenizer.from_pretrained(model_dir))):
        def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
            return token_ids_0 + (token_ids_1 or [])

    return PromptAsIs.from_pretrained(model_dir)


# -- faults (fault_tolerance, fault_tolerance_torchft) -----------------------------------
def elastic_pid(token: str, rank: int) -> int | None:
    """A torch-elastic worker's pid: the live process whose environment holds this run's token and RANK."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if (
                f"DECENTRAIN_BENCH={token}".encode() in env
                and f"RANK={rank}".encode() in env
                and b"TORCHELASTIC_RUN_ID" in b"\0".join(env)
                and " Z " not in Path(f"/proc/{pid}/stat").read_text()
            ):
                return int(pid)
        except OSError:
            continue
    return None


def stand_in() -> subprocess.Popen:
    """One busy process: keeps the faulty worker's share of the cores taken while it is out."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
