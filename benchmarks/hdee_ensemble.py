"""HDEE: heterogeneous vs homogeneous 3-expert ensembles at a matched compute budget.

Trains, on the offline multi-domain corpus, the homogeneous baseline (M, M, M at equal
steps), heterogeneous steps (M at 3:4:5 shares of the same steps) and heterogeneous
sizes (S/M/L FFN widths at equal steps) through `recipes.hdee_train` (seeds, then each
lane as its own process). All three share the same M seed. Each ensemble is scored on
the test split of the in-training domains and of two held-out domains (python_tests,
arithmetic: no seed or expert trains on them) with every weighting, and the script
counts the domains where a heterogeneous ensemble beats the homogeneous one.

    python -m benchmarks.hdee_ensemble --fresh      # 17 min training + 9 min eval on a shared 2-core CPU
    python -m benchmarks.hdee_ensemble --seed-steps 100 --steps 20 --eval-max-blocks 32 --fresh   # a quick look
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks.results_io import RESULTS, write_results
from decentrain.algorithms.hdee.budget import plan_costs
from decentrain.algorithms.hdee.config import check_plan, eval_domains, hdee_config_from_dict, plan_domains, register_hdee_configs
from decentrain.algorithms.hdee.evaluate import EnsembleScorer, format_table
from decentrain.core.world import World
from decentrain.models.factory import build_tokenizer, hf_config

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("homogeneous", "het_steps", "het_sizes")
SHARES = (3, 4, 5)  # the paper's 300/400/500


@dataclass
class BenchConfig:
    seed_steps: int = 300
    steps: int = 60  # per domain for the baseline; het_steps gets 3:4:5 shares of 3x this
    max_parallel: int = 3
    eval_max_blocks: int | None = None  # None: whole test split
    work_dir: str = str(ROOT / "runs" / "bench" / "hdee_ensemble")  # runs/ is git-ignored
    primary: str = "cached"  # weighting used for the headline win count
    eval_threads: int = 2


def overrides(bench: BenchConfig, variant: str) -> list[str]:
    het = [round(3 * bench.steps * s / sum(SHARES)) for s in SHARES]
    out = [f"hdee_plan={variant}", f"ensemble_dir={Path(bench.work_dir) / variant}", f"job.max_parallel={bench.max_parallel}",
           f"budget.baseline_steps_per_domain={bench.steps}"]
    for i in range(len(VARIANTS) if variant == "het_sizes" else 1):
        out.append(f"plan.seeds.{i}.steps={bench.seed_steps}")
    for lane in range(3):
        s = het[lane] if variant == "het_steps" else bench.steps
        out.append(f"plan.lanes.{lane}.steps=[{s},{s}]")
    if bench.eval_max_blocks:
        out.append(f"eval.max_blocks={bench.eval_max_blocks}")
    return out


def share_seed(bench: BenchConfig, variant: str) -> None:
    """Every variant branches from the same M seed: link het_sizes' seed-M instead of retraining it."""
    src, dst = Path(bench.work_dir) / "het_sizes" / "seed-M", Path(bench.work_dir) / variant / "seed-M"
    if variant != "het_sizes" and src.exists() and not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src / "model", dst / "model")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f, v in asdict(BenchConfig()).items():
        p.add_argument(f"--{f.replace('_', '-')}", type=type(v) if v is not None else int, default=v)
    p.add_argument("--fresh", action="store_true", help="delete work_dir first (else finished runs are reused)")
    args = vars(p.parse_args())
    fresh = args.pop("fresh")
    bench = BenchConfig(**args)
    if fresh:
        shutil.rmtree(bench.work_dir, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    register_hdee_configs()
    configs, seconds = {}, {}
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for v in ("het_sizes", "homogeneous", "het_steps"):  # het_sizes first: it trains the shared M seed
            raw = OmegaConf.to_container(compose("hdee", overrides=overrides(bench, v)), resolve=True)
            configs[v] = (raw, hdee_config_from_dict(raw))
            check_plan(configs[v][1])  # refuse an unmatched plan before training anything
            share_seed(bench, v)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "recipes.hdee_train", *overrides(bench, v)], cwd=ROOT, env=env, check=True)
            seconds[v] = time.perf_counter() - t0
            print(f"[bench] {v}: trained in {seconds[v]:.0f}s", flush=True)

    torch.set_num_threads(bench.eval_threads)
    results, budgets, eval_seconds = {}, {}, {}
    for v in VARIANTS:
        raw, cfg = configs[v]
        t0 = time.perf_counter()
        results[v] = EnsembleScorer(cfg, World()).evaluate()
        eval_seconds[v] = time.perf_counter() - t0
        print(f"\n[bench] {v} ({eval_seconds[v]:.0f}s to evaluate), test perplexity:\n"
              f"{format_table(results[v], cfg.eval.weightings)}", flush=True)
        hf = hf_config(cfg.model, len(build_tokenizer(cfg.model)))
        costs = plan_costs(cfg.plan, hf, include_seeds=False)
        budgets[v] = {"expert_flops": sum(c.flops for c in costs), "vs_baseline": check_plan(cfg),
                      "runs": [{"name": c.name, "params": c.params, "tokens": c.tokens} for c in costs]}

    cfg = configs["homogeneous"][1]
    trained = plan_domains(cfg)
    domains = eval_domains(cfg)
    held_out = [d for d in domains if d not in trained]
    weightings = cfg.eval.weightings
    wins = {v: {w: [d for d in domains if results[v][d]["weightings"][w] < results["homogeneous"][d]["weightings"][w]]
                for w in weightings} for v in ("het_steps", "het_sizes")}
    either = {w: [d for d in domains if d in wins["het_steps"][w] or d in wins["het_sizes"][w]] for w in weightings}
    figures = {
        "domains": {"in_training": [d for d in domains if d in trained], "held_out": held_out},
        "perplexity": results, "budget": budgets, "train_seconds": seconds, "eval_seconds": eval_seconds,
        "wins_vs_homogeneous": wins, "wins_either_het": either,
        "headline": {"weighting": bench.primary, "domains_won": len(either[bench.primary]), "domains": len(domains)},
    }
    table = summary_table(results, domains, held_out, weightings, wins, either)
    print("\n" + table)
    (RESULTS / "hdee_ensemble.txt").write_text(table + "\n")
    out = write_results("hdee_ensemble", {"bench": asdict(bench), "variants": {v: r for v, (r, _) in configs.items()}}, figures)
    png = plot(results, domains, held_out, weightings, RESULTS / "hdee_ensemble.png")
    print(f"\nwrote {out} and {png}")


def summary_table(results, domains, held_out, weightings, wins, either) -> str:
    lines = [f"{'domain':<15}{'':>3}" + "".join(f"{v + '/' + w:>22}" for w in weightings for v in VARIANTS)]
    for d in domains:
        tag = " HO" if d in held_out else ""
        lines.append(f"{d:<15}{tag:>3}" + "".join(f"{results[v][d]['weightings'][w]:>22.3f}" for w in weightings for v in VARIANTS))
    lines.append("")
    for w in weightings:
        lines.append(f"{w:>8}: het_steps beats homogeneous on {len(wins['het_steps'][w])}/{len(domains)}, "
                     f"het_sizes on {len(wins['het_sizes'][w])}/{len(domains)}, either on {len(either[w])}/{len(domains)}")
    return "\n".join(lines)


def plot(results, domains, held_out, weightings, out_png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(weightings), figsize=(4.2 * len(weightings), 4.2), sharey=True)
    x = np.arange(len(domains))
    for ax, w in zip(np.atleast_1d(axes), weightings):
        base = np.array([results["homogeneous"][d]["weightings"][w] for d in domains])
        for i, v in enumerate(("het_steps", "het_sizes")):
            het = np.array([results[v][d]["weightings"][w] for d in domains])
            ax.bar(x + (i - 0.5) * 0.38, 100 * (base - het) / base, width=0.38, label=v)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(x, [d + (" (HO)" if d in held_out else "") for d in domains], rotation=45, ha="right")
        ax.set_title(f"weighting: {w}")
        ax.grid(axis="y", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("perplexity reduction vs homogeneous (%)")
    np.atleast_1d(axes)[0].legend()
    fig.suptitle("HDEE: heterogeneous vs homogeneous 3-expert ensembles, matched compute (HO = held out)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


if __name__ == "__main__":
    main()
