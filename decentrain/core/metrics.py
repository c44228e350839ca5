"""Metrics: console lines, a JSONL file in the run dir, and optionally wandb.

wandb defaults to offline mode so that a run never waits on the network; a user who
has logged in sets `logger.wandb_mode=online`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

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
    peak_flops: float | None = None  # FLOP/s of one device for MFU; None: looked up in PEAK_FLOPS by GPU name

    def __post_init__(self) -> None:
        if self.peak_flops is not None and not (math.isfinite(self.peak_flops) and self.peak_flops > 0):
            raise ValueError(f"logger.peak_flops={self.peak_flops} must be a finite number > 0 (FLOP/s), or null")
        if self.log_every < 1:
            raise ValueError(f"logger.log_every={self.log_every} must be >= 1")
        if self.wandb_mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb_mode={self.wandb_mode!r} is unknown; allowed: {list(WANDB_MODES)}")


def is_summed_metric(key: str) -> bool:
    """Byte counts (`.../bytes_sent`, `.../payload_bytes`) are totals over a log interval; every other
    metric is a reading, of which the latest is kept."""
    return key.rsplit("/", 1)[-1].endswith("bytes") or key.endswith("bytes_sent")


def accumulate_metrics(pending: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """Fold one step's metrics into those waiting for the next log line: byte counts add up, so that
    the logged bytes are those actually sent since the last line; other keys keep their newest value."""
    out = dict(pending)
    for k, v in new.items():
        out[k] = out.get(k, 0.0) + v if is_summed_metric(k) and k in out else v
    return out


class CommMeter:
    """Bytes this replica sent: the run's total and each step's share (`comm/bytes_sent`).

    Each step it reads the algorithm's cumulative counter (`Algorithm.bytes_sent`: the transport's
    count, or DDP's) and takes the difference; a step whose sync reported its own `outer/bytes_sent`
    (payloads sent outside the transport) counts that instead, never both.
    """

    def __init__(self, total: int = 0):
        self.total = total  # restored from a checkpoint on resume
        self._last: int | None = None

    @property
    def active(self) -> bool:
        """The algorithm can tell what it sent: the run logs and prints bytes."""
        return self._last is not None

    def start(self, counter: int | None) -> None:
        self._last = counter

    def step(self, reported: float | None, counter: int | None) -> float | None:
        delta = None if counter is None or self._last is None else counter - self._last
        if counter is not None:
            self._last = counter
        sent = reported if reported is not None else delta
        if sent is None:
            return None
        self.total += int(sent)
        return float(sent)


def format_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as link rates are quoted)."""
    for unit in ("B", "kB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def metrics_file(rank: int) -> str:
    """The JSONL a rank logs to in its run dir: rank 0's is the run's own, the others' carry their rank."""
    return "metrics.jsonl" if rank == 0 else f"metrics.rank{rank}.jsonl"


class MetricsLogger:
    def __init__(
        self, cfg: LoggerConfig, run_dir: Path, rank: int, config: dict | None = None, total_steps: int | None = None
    ):
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
            self._file = open(run_dir / metrics_file(rank), "a", buffering=1)
        if cfg.progress and rank == 0 and total_steps:
            self._bar = tqdm(total=total_steps, desc="train", dynamic_ncols=True, leave=True)
        if cfg.wandb and rank == 0 and cfg.wandb_mode != "disabled":
            import wandb  # heavy import; only when asked for

            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(
                project=cfg.wandb_project,
                entity=cfg.wandb_entity,
                mode=cfg.wandb_mode,
                dir=str(run_dir),
                config=config or {},
                name=run_dir.name,
            )

    def advance(self, steps: int = 1, **postfix: float) -> None:
        if self._bar is not None:
            self._bar.update(steps)
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in postfix.items()}, refresh=False)

    def log(self, step: int, metrics: dict[str, Any], console: bool = True) -> None:
        if not self.active:
            return
        record = {
            "step": step,
            "time": time.time(),
            **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()},
        }
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


# Dense (no sparsity) bf16 tensor-core peak FLOP/s from the vendors' data sheets. Matched by
# substring of torch.cuda.get_device_name, most specific first; logger.peak_flops overrides.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
)


def peak_flops(device_name: str, override: float | None = None) -> float | None:
    """Peak FLOP/s of one device: the override, else the first table entry whose name occurs in `device_name`."""
    if override is not None:
        return override
    for name, flops in PEAK_FLOPS:
        if name.lower() in device_name.lower():
            return flops
    return None


def flops_per_token(non_embedding_params: int, layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token, as torchtitan and the PaLM paper count them.

    6·N for forward + backward of the weight matmuls (N = non-embedding parameters), plus
    12·L·H·T for attention's QKᵀ and AV (2 matmuls × fwd+bwd 3× × 2 FLOP per MAC, over T keys).
    """
    return 6 * non_embedding_params + 12 * layers * hidden * seq_len


def mfu(tokens_per_s: float, flops_per_tok: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s ÷ the device's peak."""
    return tokens_per_s * flops_per_tok / peak


class Throughput:
    """Step time, tokens/s (this rank and global), MFU and peak memory between two log steps.

    The clock runs only inside `measure()` (eval and checkpoints are excluded). The device runs
    behind the host, so a step's work must be waited for inside the clock: at log steps the loss
    read does it; before an evaluation or checkpoint that is not a log step, `drain()` does.
    Ranks sharing one GPU (`device_share` of them) each get that share of its peak FLOP/s.
    """

    def __init__(
        self,
        tokens_per_rank_step: int,
        tokens_global_step: int,
        flops_per_tok: float,
        peak: float | None,
        device: "object",
        device_share: int = 1,
        synchronize: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.tokens_rank, self.tokens_global = tokens_per_rank_step, tokens_global_step
        self.flops_per_tok, self.device = flops_per_tok, device
        self.peak = peak / device_share if peak else peak
        self._synchronize = synchronize or _device_synchronize(device)
        self._clock = clock
        self.seconds, self.steps = 0.0, 0

    @contextlib.contextmanager
    def measure(self):
        start = self._clock()
        try:
            yield
        finally:
            self.seconds += self._clock() - start
            self.steps += 1

    def drain(self) -> None:
        """Wait for all device work queued so far (call inside `measure()`, before leaving the clock)."""
        self._synchronize()

    def read(self) -> dict[str, float]:
        """Metrics of the steps since the last read (empty if none), then start a new interval."""
        if self.steps == 0 or self.seconds <= 0:
            return {}
        step_s = self.seconds / self.steps
        tps = self.tokens_rank / step_s
        out = {
            "perf/step_ms": step_s * 1e3,
            "perf/tokens_per_s": tps,
            "perf/tokens_per_s_global": self.tokens_global / step_s,
        }
        if self.peak:
            out["perf/mfu"] = mfu(tps, self.flops_per_tok, self.peak)
        if getattr(self.device, "type", None) == "cuda":
            import torch

            out["perf/mem_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            torch.cuda.reset_peak_memory_stats(self.device)
        self.seconds, self.steps = 0.0, 0
        return out


def _device_synchronize(device: "object") -> Callable[[], None]:
    if getattr(device, "type", None) == "cuda":
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None  # CPU work is done when the host call returns


def drop_rows_after(path: Path, step: int) -> None:
    """Rewrite a metrics JSONL without its rows past `step` (atomically; unparsable lines go too).

    A run resumed from `step` logs the steps after it again; their old rows would double.
    """
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line)
        except (ValueError, AttributeError):
            continue
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in kept))
    os.replace(tmp, path)


def corpus_header(rows: Iterable[dict]) -> dict | None:
    """The corpus a run's metrics name: the header record's {name, hash, note} (run_pretraining writes it); None
    when the run logged none."""
    return next((r["corpus"] for r in rows if isinstance(r.get("corpus"), dict)), None)


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(
    records: Iterable[dict],
    keys: list[str],
    out_png: Path,
    title: str = "",
    *,
    xlabel: str = "step",
    ylabel: str = "loss",
    labels: dict[str, str] | None = None,
) -> Path:
    """One line per key against step (records missing a key are skipped); `labels` renames keys in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in keys:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), label=(labels or {}).get(key, key), marker="o" if len(pts) < 30 else None)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
