"""`decentrain compare`: several pre-training algorithms at one layout, read side by side.

Each arm is an ordinary run of the pre-training recipe (recipes/compare.py starts it; this module
never trains), at the same workers, global batch, steps, model, data and seed; only `algorithm=` (and
its H) differs. This module holds the config, each arm's overrides, and the reading of what each arm
wrote: its `result.json` (the run's end) and its `metrics.jsonl` (eval loss against step, wall time and
bytes sent per worker: rank 0's `comm/bytes_sent_total`), then a table, a figure and a paragraph
generated from those numbers. It serves the one recipe, so it sits beside it, not in the library.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import decentrain.config  # noqa: F401  (the composition root: importing it registers every loop algorithm)
from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.run import RESULT_FILE
from decentrain.core.metrics import corpus_header, format_bytes, read_jsonl

UNTUNED = "untuned defaults, 1 seed"


@dataclass
class ArmSettings:
    """One arm's settings in a preset (conf/compare/<scale>.yaml) and what stands behind them."""

    overrides: list[str] = field(default_factory=list)  # e.g. algorithm.outer_optimizer.lr=1.4
    behind: str = UNTUNED  # the benchmark record, its tuning and eval seeds; or UNTUNED


@dataclass
class CompareConfig:
    algorithms: list[str] = field(default_factory=lambda: ["ddp", "diloco", "noloco", "sparseloco"])
    workers: int = 4  # launcher.nproc_per_node of every arm (replicas)
    steps: int = 200
    global_batch_size: int = 32
    micro_batch_size: int = 8
    inner_steps: int = 20  # H of every inner/outer arm
    eval_every: int = 20
    link_mbit: float = 100.0  # a slow link between workers, for the transfer-time column
    overrides: list[str] = field(default_factory=list)  # more Hydra overrides for every arm, e.g. [model=qwen2_tiny]
    # the preset's model and data for every arm (before `overrides`)
    scale_overrides: list[str] = field(default_factory=list)
    run_dir: str = "runs/compare"
    preset: str = "custom"  # the conf/compare/ preset that set the layout and the arms' settings
    arms: dict[str, ArmSettings] = field(default_factory=dict)  # per algorithm; an arm not named runs at UNTUNED

    def __post_init__(self) -> None:
        try:
            self.arms = {k: v if isinstance(v, ArmSettings) else ArmSettings(**v) for k, v in self.arms.items()}
        except TypeError as e:
            raise ValueError(f"arms: each arm takes overrides and behind ({e})") from None
        for name in ("workers", "steps", "global_batch_size", "micro_batch_size", "inner_steps", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if not self.algorithms:
            raise ValueError("algorithms=[] names no arm; e.g. algorithms=[ddp,noloco]")
        for name in self.algorithms:
            ALGORITHMS.get(name, field="algorithms")  # an unknown one fails here, before the first arm trains
        if not (math.isfinite(self.link_mbit) and self.link_mbit > 0):
            raise ValueError(f"link_mbit={self.link_mbit} must be a finite number > 0")


def syncs_every_step(algorithm: str) -> bool:
    """The arm averages every step (DDP: Algorithm.syncs_every_step): it takes no H and has no outer settings."""
    return ALGORITHMS.get(algorithm, field="algorithms").syncs_every_step


def arm_overrides(cfg: CompareConfig, algorithm: str, run_dir: Path) -> list[str]:
    """The recipe's overrides for one arm: the shared layout, then this arm's algorithm."""
    out = [
        f"algorithm={algorithm}",
        f"launcher.nproc_per_node={cfg.workers}",
        f"train.steps={cfg.steps}",
        f"train.global_batch_size={cfg.global_batch_size}",
        f"train.micro_batch_size={cfg.micro_batch_size}",
        f"train.eval_every={cfg.eval_every}",
        "train.device=cpu",
        "logger.progress=false",
        "resume=false",
        f"run_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
    ]
    if not syncs_every_step(algorithm):
        out.append(f"algorithm.inner_steps={cfg.inner_steps}")
    return [*out, *cfg.scale_overrides, *settings(cfg, algorithm).overrides, *cfg.overrides]  # the user's own win


def settings(cfg: CompareConfig, algorithm: str) -> ArmSettings:
    return cfg.arms.get(algorithm, ArmSettings())


def settings_line(cfg: CompareConfig) -> str:
    """Which settings each arm ran at and what stands behind them: a reading names them before any number."""
    parts = []
    for name in cfg.algorithms:
        s = settings(cfg, name)
        what = " ".join(s.overrides) if s.overrides else f"conf/algorithm/{name}.yaml's defaults"
        behind = "no outer settings" if syncs_every_step(name) and not s.overrides else s.behind
        parts.append(f"{name} at {what} ({behind})")
    tuned = any(settings(cfg, n).behind != UNTUNED for n in cfg.algorithms if not syncs_every_step(n))
    return (
        f"Settings (preset {cfg.preset}): "
        + "; ".join(parts)
        + ". This run is one seed"
        + ("" if tuned else ", at settings no benchmark tuned at this scale")
        + ": it shows the methods side by side and decides "
        "nothing; the verdicts, each decided on paired seeds, are in the README's reproduction table."
    )


@dataclass
class Arm:
    name: str
    step: list[int]  # at each evaluation
    eval_loss: list[float]
    seconds: list[float]  # time/train_s of the log line at that step
    bytes_sent: list[float]  # rank 0's cumulative bytes at that step
    eval_bpb: list[float] = field(default_factory=list)  # bits per byte at each evaluation (empty: not logged)
    corpus: dict | None = None  # the metrics header's {name, hash, note}

    @property
    def final(self) -> dict[str, float]:
        return {
            "step": self.step[-1],
            "eval_loss": self.eval_loss[-1],
            "seconds": self.seconds[-1],
            "bytes_sent": self.bytes_sent[-1],
            "eval_bpb": self.eval_bpb[-1] if self.eval_bpb else math.nan,
        }


def read_result(run_dir: Path) -> dict | None:
    """An arm's `result.json` (its rank 0 writes it as the run ends); None if the run did not get there."""
    try:
        return json.loads((run_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def read_arm(name: str, run_dir: Path) -> Arm:
    """Eval points of one arm's rank-0 metrics, each with the wall time and bytes of its step's log line."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train = {r["step"]: r for r in rows if "train/loss" in r}
    points = [(r["step"], r["eval/loss"]) for r in rows if r.get("eval/loss") is not None and r["step"] in train]
    if not points:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no evaluation: the {name} arm did not finish")
    bpb = {r["step"]: r["eval/bpb"] for r in rows if r.get("eval/bpb") is not None}
    return Arm(
        name,
        [s for s, _ in points],
        [v for _, v in points],
        [train[s].get("time/train_s", math.nan) for s, _ in points],
        [train[s].get("comm/bytes_sent_total", 0.0) for s, _ in points],
        [bpb[s] for s, _ in points] if all(s in bpb for s, _ in points) else [],
        corpus_header(rows),
    )


def corpus_line(arms: list[Arm]) -> str:
    """The text every arm trained on, by its hash (or why it has none); arms that disagree are named."""
    names = {json.dumps(a.corpus, sort_keys=True) for a in arms}
    if len(names) > 1:
        return "The arms trained on different corpora: " + "; ".join(f"{a.name}: {a.corpus}" for a in arms) + "."
    c = arms[0].corpus
    if not c:
        return "Corpus: not logged by these runs."
    return f"Corpus: {c['name']} {c['hash']}." if c.get("hash") else f"Corpus: {c['name']} ({c.get('note')}, no hash)."


def table(arms: list[Arm], link_mbit: float) -> str:
    ref = arms[0].final["bytes_sent"]
    lines = [
        f"{'algorithm':<11} {'step':>5} {'eval loss':>9} {'bits/byte':>9} {'train s':>8} {'sent/worker':>12} "
        f"{'vs ' + arms[0].name:>10} {f'at {link_mbit:g} Mbit/s':>14}"
    ]
    for a in arms:
        f = a.final
        ratio = f"{ref / f['bytes_sent']:.0f}x less" if f["bytes_sent"] and a is not arms[0] else "-"
        bpb = f"{f['eval_bpb']:>9.3f}" if math.isfinite(f["eval_bpb"]) else f"{'-':>9}"
        lines.append(
            f"{a.name:<11} {f['step']:>5} {f['eval_loss']:>9.3f} {bpb} {f['seconds']:>8.1f} "
            f"{format_bytes(f['bytes_sent']):>12} {ratio:>10} "
            f"{link_seconds(f['bytes_sent'], link_mbit):>12.1f} s"
        )
    return "\n".join(lines)


def link_seconds(nbytes: float, link_mbit: float) -> float:
    """The floor of sending `nbytes` over one uplink of `link_mbit`: bytes / link rate."""
    return nbytes * 8 / (link_mbit * 1e6)


def reading(arms: list[Arm], cfg: CompareConfig) -> str:
    """One paragraph from the numbers: who reached what loss per step, and at what traffic."""
    by = {a.name: a.final for a in arms}
    best = min(arms, key=lambda a: a.final["eval_loss"])
    most = max(arms, key=lambda a: a.final["bytes_sent"])
    sends = "sends" if best is most else f"{most.name} sends"
    text = [
        f"After {cfg.steps} steps on {cfg.workers} workers (global batch {cfg.global_batch_size}), "
        f"{best.name} has the lowest eval loss ({best.final['eval_loss']:.3f}) and {sends} the most "
        f"({format_bytes(most.final['bytes_sent'])} per worker)."
    ]
    for a in arms:
        if a.name == most.name or not a.final["bytes_sent"]:
            continue
        f = a.final
        text.append(
            f"{a.name} sends {most.final['bytes_sent'] / f['bytes_sent']:.0f}x less than {most.name} "
            f"for eval {f['eval_loss']:.3f} ({f['eval_loss'] - by[most.name]['eval_loss']:+.3f})."
        )
    if syncs_every_step(most.name) and most.final["step"]:  # at equal traffic: how far the every-step arm got
        per_step = most.final["bytes_sent"] / most.final["step"]
        lean = [a for a in arms if a is not most and a.final["bytes_sent"]]
        if lean and per_step:
            text.append(
                f"{most.name} had sent as much as each of them sends in the whole run after "
                + ", ".join(f"{math.ceil(a.final['bytes_sent'] / per_step)} ({a.name})" for a in lean)
                + f" of its {most.final['step']} steps."
            )
    rounds = cfg.steps // cfg.inner_steps
    every = next((n for n in by if syncs_every_step(n)), None)
    if every and any(not syncs_every_step(n) and by[n]["eval_loss"] > by[every]["eval_loss"] for n in by):
        text.append(
            f"The low-communication methods sync once every {cfg.inner_steps} steps "
            f"({rounds} outer steps in this run), so per step they trail {every.upper()}, "
            "which averages every gradient; that gap is the price of their traffic, "
            f"and whether longer runs close it is what `decentrain compare steps={10 * cfg.steps}` shows."
        )
    slow = link_seconds(most.final["bytes_sent"], cfg.link_mbit)
    leanest = min(link_seconds(a.final["bytes_sent"], cfg.link_mbit) for a in arms)
    text.append(
        f"On a {cfg.link_mbit:g} Mbit/s link between workers {most.name}'s traffic alone would take "
        f"{slow:.0f} s, against {leanest:.1f} s for the leanest arm; "
        "here the workers share one machine over loopback, so wall time measures compute, not the network."
    )
    return " ".join(text)


def plot(arms: list[Arm], out_png: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    for a in arms:
        for ax, x in zip(axes, (a.step, a.seconds, [max(b, 1.0) / 1e6 for b in a.bytes_sent])):
            ax.plot(x, a.eval_loss, marker="o", ms=3, label=a.name)
    for ax, label in zip(axes, ("step", "training wall time (s, one shared machine)", "MB sent per worker (log)")):
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[2].set_xscale("log")
    axes[0].set_ylabel("eval loss")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


def write_summary(arms: list[Arm], cfg: CompareConfig, out_dir: Path) -> str:
    """compare.json, compare.png and compare.txt in `out_dir`; returns the text printed."""
    title = (
        f"{', '.join(a.name for a in arms)}: {cfg.workers} workers, batch {cfg.global_batch_size}, {cfg.steps} steps"
    )
    plot(arms, out_dir / "compare.png", title)
    text = f"{table(arms, cfg.link_mbit)}\n{corpus_line(arms)}\n\n{settings_line(cfg)}\n\n{reading(arms, cfg)}\n"
    (out_dir / "compare.txt").write_text(text)
    record = {"config": asdict(cfg), "arms": [asdict(a) for a in arms]}
    (out_dir / "compare.json").write_text(json.dumps(record, indent=1))
    return text
