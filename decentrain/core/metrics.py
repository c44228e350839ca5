"""Metrics: console lines, a JSONL file in the run dir, and optionally wandb.

wandb defaults to offline mode so that a run never waits on the network; a user who
has logged in sets `logger.wandb_mode=online`.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tqdm.auto import tqdm

WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class LoggerConfig:
    name: str = "default"
    console: bool = True
    jsonl: bool = True
    progress: bool = True  # tqdm bar on rank 0
    log_every: int = 10
    all_ranks: bool = False  # every rank writes metrics.rank<r>.jsonl (replicas that differ)
    wandb: bool = False
    wandb_mode: str = "offline"
    wandb_project: str = "decentrain"
    wandb_entity: str | None = None

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise ValueError(f"logger.log_every={self.log_every} must be >= 1")
        if self.wandb_mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb_mode={self.wandb_mode!r} is unknown; allowed: {list(WANDB_MODES)}")


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class MetricsLogger:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, rank: int, config: dict | None = None, total_steps: int | None = None):
        self.cfg = cfg
        self.rank = rank
        self.active = rank == 0 or cfg.all_ranks
        self._file = None
        self._wandb = None
        self._bar = None
        if not self.active:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.jsonl:
            name = "metrics.jsonl" if rank == 0 else f"metrics.rank{rank}.jsonl"
            self._file = open(run_dir / name, "a", buffering=1)
        if cfg.progress and rank == 0 and total_steps:
            self._bar = tqdm(total=total_steps, desc="train", dynamic_ncols=True, leave=True)
        if cfg.wandb and rank == 0 and cfg.wandb_mode != "disabled":
            import wandb  # heavy import; only when asked for

            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(
                project=cfg.wandb_project, entity=cfg.wandb_entity, mode=cfg.wandb_mode,
                dir=str(run_dir), config=config or {}, name=run_dir.name,
            )

    def advance(self, steps: int = 1, **postfix: float) -> None:
        if self._bar is not None:
            self._bar.update(steps)
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in postfix.items()}, refresh=False)

    def log(self, step: int, metrics: dict[str, Any], console: bool = True) -> None:
        if not self.active:
            return
        record = {"step": step, "time": time.time(), **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}}
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        if console and self.cfg.console and self.rank == 0:
            line = f"step {step:>6} | " + " | ".join(f"{k} {_fmt(v)}" for k, v in metrics.items())
            (self._bar.write if self._bar is not None else print)(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(records: Iterable[dict], keys: list[str], out_png: Path, title: str = "") -> Path:
    """One line per key against step (records missing a key are skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in keys:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), label=key, marker="o" if len(pts) < 30 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
