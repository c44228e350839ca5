"""DEI: one node vs a homogeneous vs a heterogeneous 4-node ensemble at equal total model calls, over seeds.

Each run is `python -m recipes.dei` (the library's own search, sharing and pMARS battles):
- single: 1 node, the whole call budget, the homogeneous arm's model;
- homogeneous: 4 nodes, the same model (seeded apart), a quarter of the calls each;
- heterogeneous: 4 nodes, four different small models (two families, four sizes).
Operators are small from-config LMs trained once on the shipped warriors (`dei/sft.py`) and
shared by every arm and seed, so arms differ only in how the budget is spread and on which models.

Figures per run (the paper's): merged-archive QD-score and coverage, on fitness re-measured
against one common opponent set (the initial opponents), and held-out generality: the win rate
(ties count half) of the merged archive's 4 best warriors against warriors that no run trains on,
fights or shares (benchmarks/dei_heldout/). Paired over seeds: heterogeneous − homogeneous and
homogeneous − single, mean ± std, paired t-test. Target: the paper's ordering
(heterogeneous > homogeneous > single on QD-score and coverage).

Departures from the paper (DEI, Donaghy and Rastogi 2026; DRQ): tiny byte-level LMs on 2 CPU cores
instead of API models; DRQ's `uo,pl` descriptor axes (pMARS reports no trace for `tsp,mc`);
a few rounds and tens of calls per node instead of DRQ's 10 x 100; no hyper-parameter tuning
(every arm runs DRQ's defaults: sample_new_percent 0.1, temperature 1).

    python -m benchmarks.dei_search                 # 3 seeds
    python -m benchmarks.dei_search --seeds 4 --calls-per-node 24
    python -m benchmarks.dei_search --reanalyse     # the figures and decisions again from the committed record
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness import (
    CACHE_DIR,
    Harness,
    config_parser,
    fmt,
    header,
    mean_std,
    parse_config,
    reanalyse,
    save_figure,
)
from benchmarks.protocol import DecisionRule, decision, describe

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "benchmarks" / "dei_heldout"
ARMS = ("single", "homogeneous", "heterogeneous")
ORDER_RULE = DecisionRule("better", lower_is_better=False)  # a higher QD-score, decided on the paired 95 % interval
# (family, hidden, layers, heads, ffn): the homogeneous arm and the single node use the first
MODELS = (("llama", 96, 3, 4, 256), ("qwen2", 128, 2, 4, 320), ("llama", 64, 4, 2, 192), ("qwen2", 96, 3, 4, 256))


@dataclass
class BenchConfig:
    nodes: int = 4
    rounds: int = 3
    calls_per_node: int = 24  # per round: n_init + iters; the single node gets nodes x this
    n_init: int = 2
    sft_steps: int = 300
    battle_rounds: int = 20
    heldout_rounds: int = 20


def _model(spec) -> dict:
    family, hidden, layers, heads, ffn = spec
    return {
        "family": family,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "intermediate_size": ffn,
        "max_seq_len": 512,
    }


def train_operators(cfg: BenchConfig) -> list[str]:
    """Each operator model trained once (cached by its spec and steps) on the shipped warriors."""
    from decentrain.algorithms.dei.sft import OperatorSFTConfig, train_operator
    from decentrain.models.factory import ModelConfig

    out = []
    for spec in MODELS:
        path = CACHE_DIR / "dei_operators" / f"{'_'.join(map(str, spec))}_s{cfg.sft_steps}"
        if not (path / "config.json").is_file():
            train_operator(OperatorSFTConfig(steps=cfg.sft_steps, model=ModelConfig(**_model(spec))), path)
        out.append(str(path))
    return out


def _run(job: dict) -> dict:
    cfg = BenchConfig(**job["cfg"])
    arm, seed, operators = job["arm"], job["seed"], job["operators"]
    n = 1 if arm == "single" else cfg.nodes
    per_round = cfg.calls_per_node * (cfg.nodes if arm == "single" else 1)
    paths = [operators[0]] * n if arm != "heterogeneous" else operators[:n]
    nodes = ",".join(f"{{model: {{pretrained: '{p}'}}}}" for p in paths)
    run_dir = ROOT / "runs" / "bench" / "dei_search" / f"{arm}_s{seed}"
    cmd = [
        sys.executable,
        "-m",
        "recipes.dei",
        f"num_nodes={n}",
        f"seed={seed}",
        f"nodes=[{nodes}]",
        f"search.rounds={cfg.rounds}",
        f"search.n_init={cfg.n_init * (cfg.nodes if arm == 'single' else 1)}",
        f"search.iters={per_round - cfg.n_init * (cfg.nodes if arm == 'single' else 1)}",
        f"pmars.rounds={cfg.battle_rounds}",
        f"run_dir={run_dir}",
        "share.deadline_s=600",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    calls = sum(row["calls_used"] for row in summary["nodes"].values())
    return {
        "qd_score": summary["merged"]["qd_score"],
        "coverage": summary["merged"]["coverage"],
        "cells": summary["merged"]["cells"],
        "calls": calls,
        "heldout_win_rate": heldout(run_dir, cfg, seed),
        "nodes_finished": summary["nodes_finished"],
    }


def heldout(run_dir: Path, cfg: BenchConfig, seed: int) -> float:
    """Mean win rate (ties half) of the merged archive's 4 best warriors, 1 v 1 against each held-out warrior."""
    from decentrain.algorithms.dei.node import read_elites
    from decentrain.algorithms.dei.pmars import PMarsConfig, battle
    from decentrain.algorithms.dei.redcode import parse

    best = sorted(read_elites(run_dir), key=lambda e: -e.fitness)[:4]
    held = [parse(p.read_text()).warrior for p in sorted(HELDOUT.glob("*.red"))]
    pm = PMarsConfig(rounds=cfg.heldout_rounds)
    rates = []
    for i, e in enumerate(best):
        w = parse(e.text).warrior
        for j, h in enumerate(held):
            r = battle([w, h], pm, seed=seed * 1000 + i * 10 + j)
            if r is not None:
                rates.append((r.placings[0][0] + 0.5 * r.placings[0][1]) / r.rounds)
    return sum(rates) / len(rates) if rates else 0.0


def paired(a: list[float], b: list[float]) -> dict:
    from scipy.stats import ttest_rel

    diff = [x - y for x, y in zip(a, b)]
    out = mean_std(diff)
    out["p"] = float(ttest_rel(a, b).pvalue) if len(diff) > 1 and len(set(diff)) > 1 else None
    return out


def figures_from(runs: dict[str, dict]) -> dict:
    """Every figure from the runs ({arm}_s{seed}: result): per-arm means, paired differences, and the paper's ordering
    decided pair by pair on the QD-score's paired 95 % interval (benchmarks/protocol.py), with the seeds an
    observed difference would need."""
    seeds = sorted({int(k.rsplit("_s", 1)[1]) for k in runs})
    by = {arm: [runs[f"{arm}_s{s}"] for s in seeds] for arm in ARMS}
    pairs = (("heterogeneous", "homogeneous"), ("homogeneous", "single"))
    figures = {
        "per_arm": {
            arm: {k: mean_std([r[k] for r in rs]) for k in ("qd_score", "coverage", "heldout_win_rate", "calls")}
            for arm, rs in by.items()
        },
        "paired": {
            f"{a}-{b}": {
                k: paired([r[k] for r in by[a]], [r[k] for r in by[b]])
                for k in ("qd_score", "coverage", "heldout_win_rate")
            }
            for a, b in pairs
        },
        "decisions": {
            f"{a}_above_{b}": decision(
                f"{a}_above_{b}",
                a,
                b,
                ORDER_RULE,
                [r["qd_score"] for r in by[a]],
                [r["qd_score"] for r in by[b]],
                "merged-archive QD-score",
            )
            for a, b in pairs
        },
        "runs": runs,
    }
    figures["ordering_met"] = all(
        figures["paired"][p][k]["mean"] > 0 for p in figures["paired"] for k in ("qd_score", "coverage")
    )
    figures["ordering_decided"] = all(d["result"]["supported"] for d in figures["decisions"].values())
    return figures


def main() -> None:
    ap = config_parser(BenchConfig, __doc__)
    ap.add_argument("--reanalyse", action="store_true", help="recompute the committed result's figures from its runs")
    cfg, seeds, allow_dirty, fresh, smoke, again = parse_config(ap, BenchConfig, "smoke", "reanalyse")
    if again:
        path = ROOT / "benchmarks" / "results" / "dei_search.json"
        print(
            reanalyse(path, lambda rec: figures_from(rec["figures"]["runs"]), text, plot, allow_dirty=allow_dirty)[
                "txt"
            ].read_text()
        )
        return
    h = Harness(
        "dei_search", __file__, {**asdict(cfg), "seeds": seeds}, allow_dirty=allow_dirty, fresh=fresh, smoke=smoke
    )
    operators = train_operators(cfg)
    jobs = [{"arm": arm, "seed": s, "cfg": asdict(cfg), "operators": operators} for s in range(seeds) for arm in ARMS]
    results = h.run_jobs(jobs, _run)
    runs = {f"{j['arm']}_s{j['seed']}": r for j, r in zip(jobs, results)}
    h.write(figures_from(runs), text, plot)
    print(text(json.loads((ROOT / "benchmarks" / "results" / "dei_search.json").read_text())))


def text(record: dict) -> str:
    f = record["figures"]
    lines = [
        header(record),
        "",
        "merged-archive QD-score / coverage / held-out win rate per arm (mean ± std over seeds; equal total calls):",
    ]
    for arm, st in f["per_arm"].items():
        lines.append(
            f"  {arm:13s} QD {fmt(st['qd_score'], 2)}   coverage {fmt(st['coverage'], 3)}   "
            f"held-out {fmt(st['heldout_win_rate'], 3)}   calls {st['calls']['mean']:.0f}"
        )
    lines.append("paired differences (mean ± std, paired t-test p):")
    for pair, ks in f["paired"].items():
        lines.append(
            "  "
            + pair
            + ": "
            + "; ".join(
                f"{k} {fmt(v, 3)} (p={v['p']:.3f})" if v["p"] is not None else f"{k} {fmt(v, 3)}" for k, v in ks.items()
            )
        )
    lines.append(
        f"target (heterogeneous > homogeneous > single on QD-score and coverage): "
        f"{'met' if f['ordering_met'] else 'NOT met'} in the means"
    )
    for name, d in f.get("decisions", {}).items():
        lines.append(
            f"decision {name} (QD-score, the paired 95 % interval above 0; benchmarks/protocol.py): "
            f"{describe(d['result'], 2)}"
        )
    return "\n".join(lines)


def plot(record: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = record["figures"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key, title in zip(
        axes, ("qd_score", "coverage", "heldout_win_rate"), ("merged QD-score", "coverage", "held-out win rate")
    ):
        for i, arm in enumerate(ARMS):
            vals = f["per_arm"][arm][key]["values"]
            ax.scatter([i] * len(vals), vals, alpha=0.6)
            ax.errorbar(i, f["per_arm"][arm][key]["mean"], yerr=f["per_arm"][arm][key]["std"], fmt="k_", capsize=6)
        ax.set_xticks(range(len(ARMS)), ARMS)
        ax.set_title(title)
    fig.suptitle(f"DEI at equal total model calls ({record['git_sha'][:8]})")
    fig.tight_layout()
    save_figure(fig, png, dpi=110)


if __name__ == "__main__":
    main()
