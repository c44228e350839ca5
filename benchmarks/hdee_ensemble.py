"""HDEE: heterogeneous vs homogeneous 3-expert ensembles at a matched compute budget, per plan, over seeds.

Trains, on the offline multi-domain corpus, the homogeneous baseline (M, M, M at equal
steps), heterogeneous steps (M at 3:4:5 shares of the same steps) and heterogeneous sizes
(S/M/L FFN widths at equal steps) with the recipe's own `run_stage(job.stage=all)` in this
process (seeds, then lanes in turn): on 2 shared cores the recipe's one process per seed
and lane costs more start-up than training at this scale. Within a training seed the three
plans share the same M seed model. Each ensemble is scored on the test split of the
in-training domains and of two held-out domains (python_tests, arithmetic: no seed or
expert trains on them).

Each heterogeneous plan is compared with the homogeneous one on its own: per domain the
paired difference (homogeneous − het perplexity, % of homogeneous) over S training
seeds, mean ± std; a domain is won only when the mean difference exceeds its std (the
raw count, mean > 0, is shown beside it). Target (paper: 20/21 per plan): >= 80% per plan.
Every (seed) run is checkpointed in the harness cache; nothing else is reused.

    python -m benchmarks.hdee_ensemble                       # 3 seeds at once at the reduced scale below
    python -m benchmarks.hdee_ensemble --seed-steps 300 --steps 60 --eval-max-blocks 0   # the earlier, larger scale
    python -m benchmarks.hdee_ensemble --probe-steps 20 80 --seeds 2   # scale probe -> results/hdee_scale_probe.*

The scale probe asks at what expert step budget heterogeneity starts to pay: homogeneous vs
het_steps (one shared M seed, no S/L seeds to train) at each `--probe-steps` budget per
domain, the same paired per-domain differences, side by side in one record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks.harness import RESULTS, Harness, config_parser, fmt, header, mean_std, parse, reanalyse, save_figure
from decentrain.algorithms.hdee.compute_budget import plan_costs
from decentrain.algorithms.hdee.config import check_plan, eval_domains, hdee_config_from_dict, plan_domains
from decentrain.algorithms.hdee.evaluate import EnsembleScorer
from decentrain.algorithms.hdee.train import run_stage
from decentrain.config import register_configs
from decentrain.core.world import World
from decentrain.models.factory import build_tokenizer, hf_config

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("homogeneous", "het_steps", "het_sizes")
HET = ("het_steps", "het_sizes")
SHARES = (3, 4, 5)  # the paper's 300/400/500
TARGET_SHARE = 0.8


@dataclass
class BenchConfig:
    seed_steps: int = 100
    steps: int = 20  # per domain for the baseline; het_steps gets 3:4:5 shares of 3x this
    max_parallel: int = 3
    eval_max_blocks: int = 16  # test blocks per domain; 0: whole test split
    work_dir: str = "runs/bench/hdee_ensemble"  # runs/ is git-ignored; one sub-directory per training seed
    primary: str = "cached"  # weighting used for the headline win count
    eval_threads: int = 1  # torch threads for training and scoring


def overrides(bench: BenchConfig, variant: str, seed: int) -> list[str]:
    het = [round(3 * bench.steps * s / sum(SHARES)) for s in SHARES]
    out = [
        f"hdee_plan={variant}",
        f"ensemble_dir={ROOT / bench.work_dir / f'seed{seed}' / variant}",
        f"job.max_parallel={bench.max_parallel}",
        f"budget.baseline_steps_per_domain={bench.steps}",
        f"train.seed={seed}",
    ]
    for i in range(len(VARIANTS) if variant == "het_sizes" else 1):
        out.append(f"plan.seeds.{i}.steps={bench.seed_steps}")
    for lane in range(3):
        s = het[lane] if variant == "het_steps" else bench.steps
        out.append(f"plan.lanes.{lane}.steps=[{s},{s}]")
    if bench.eval_max_blocks:
        out.append(f"eval.max_blocks={bench.eval_max_blocks}")
    return out


def share_seed(bench: BenchConfig, variant: str, seed: int, first: str = "het_sizes") -> None:
    """Every variant branches from the same M seed: copy the first variant's seed-M instead of retraining it."""
    base = ROOT / bench.work_dir / f"seed{seed}"
    src, dst = base / first / "seed-M", base / variant / "seed-M"
    if variant != first and src.exists() and not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src / "model", dst / "model")


def compose_variant(bench: BenchConfig, variant: str, seed: int):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        raw = OmegaConf.to_container(compose("hdee", overrides=overrides(bench, variant, seed)), resolve=True)
    return raw, hdee_config_from_dict(raw)


def run_seed(job: dict) -> dict:
    """Train the plans (default all three) from scratch for one training seed and score each ensemble."""
    bench, seed = BenchConfig(**job["bench"]), job["seed"]
    variants = job.get("variants", VARIANTS)
    shutil.rmtree(ROOT / bench.work_dir / f"seed{seed}", ignore_errors=True)  # only the harness cache resumes
    torch.set_num_threads(bench.eval_threads)
    out: dict = {"perplexity": {}, "train_s": {}, "eval_s": {}}
    # the first trains the shared M seed
    order = [v for v in ("het_sizes", "homogeneous", "het_steps") if v in variants]
    for v in order:
        cfg = compose_variant(bench, v, seed)[1]
        check_plan(cfg)  # refuse an unmatched plan before training anything
        share_seed(bench, v, seed, first=order[0])
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            run_stage(dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, stage="all")), World())
        out["train_s"][v] = time.perf_counter() - t0
    for v in order:
        t0 = time.perf_counter()
        res = EnsembleScorer(compose_variant(bench, v, seed)[1], World()).evaluate()
        out["perplexity"][v] = {d: r["weightings"] for d, r in res.items()}
        out["eval_s"][v] = time.perf_counter() - t0
    return out


def main() -> None:
    p = config_parser(BenchConfig, __doc__)
    p.add_argument("--parallel", type=int, default=3, help="training seeds run at once (processes)")
    p.add_argument(
        "--probe-steps",
        type=int,
        nargs="+",
        default=None,
        help="scale probe instead: homogeneous vs het_steps at each of these steps per domain",
    )
    p.add_argument(
        "--regenerate", action="store_true", help="re-analyse benchmarks/results/hdee_ensemble.json (no training)"
    )
    args = vars(parse(p))
    smoke = args.pop("smoke")
    nseeds, allow_dirty, fresh, parallel = (
        args.pop("seeds"),
        args.pop("allow_dirty"),
        args.pop("fresh"),
        args.pop("parallel"),
    )
    probe, regen = args.pop("probe_steps"), args.pop("regenerate")
    bench = BenchConfig(**args)
    register_configs("hdee")
    if regen:
        return regenerate(RESULTS / "hdee_ensemble.json", allow_dirty)
    if probe:
        return scale_probe(bench, probe, nseeds, parallel, allow_dirty, fresh, smoke)
    configs = {v: compose_variant(bench, v, 0) for v in VARIANTS}
    budgets = {}
    for v, (_, cfg) in configs.items():
        hf = hf_config(cfg.model, len(build_tokenizer(cfg.model)))
        costs = plan_costs(cfg.plan, hf, include_seeds=False)
        budgets[v] = {
            "expert_flops": sum(c.flops for c in costs),
            "vs_baseline": check_plan(cfg),
            "runs": [{"name": c.name, "params": c.params, "tokens": c.tokens} for c in costs],
        }
    config = {
        "bench": asdict(bench),
        "seeds": list(range(nseeds)),
        "variants_seed0": {v: raw for v, (raw, _) in configs.items()},
    }
    hz = Harness("hdee_ensemble", __file__, config, allow_dirty=allow_dirty, fresh=fresh, smoke=smoke)
    runs = hz.run_jobs(
        [{"bench": asdict(bench), "seed": s} for s in range(nseeds)], run_seed, desc="hdee seeds", parallel=parallel
    )
    figures = {
        **analyze(bench, {v: c for v, (_, c) in configs.items()}, [r["perplexity"] for r in runs]),
        "budget": budgets,
        "train_s": {v: mean_std([r["train_s"][v] for r in runs]) for v in VARIANTS},
        "eval_s": {v: mean_std([r["eval_s"][v] for r in runs]) for v in VARIANTS},
    }
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


def structural_ties(hom, het) -> list[str]:
    """Domains every one of whose lanes is the same run in both plans (same seed, domains, steps and width, so the
    same weights): they differ only through the other experts and count as neither a win nor a loss."""

    def lanes_of(cfg, d):
        return [
            (lane.domains, lane.steps, lane.intermediate_size, asdict(cfg.plan.seed(lane.seed)))
            for lane in cfg.plan.lanes
            if d in lane.domains
        ]

    return [d for d in plan_domains(hom) if lanes_of(hom, d) and lanes_of(hom, d) == lanes_of(het, d)]


def analyze(bench: BenchConfig, cfgs: dict, perplexity: list[dict]) -> dict:
    """Per het plan and weighting: paired differences, wins over the domains that are not structural ties."""
    runs = [{"perplexity": p} for p in perplexity]
    cfg = cfgs["homogeneous"]
    trained, domains = plan_domains(cfg), eval_domains(cfg)
    per_plan, ties = {}, {}
    for v in HET:
        ties[v] = structural_ties(cfg, cfgs[v])
        counted = [d for d in domains if d not in ties[v]]
        per_plan[v] = {}
        for w in cfg.eval.weightings:
            pd = paired_diffs(runs, v, w, domains, ties[v])
            per_seed = [
                sum(r["perplexity"][v][d][w] < r["perplexity"]["homogeneous"][d][w] for d in counted) for r in runs
            ]
            per_plan[v][w] = {
                **pd,
                "won_per_seed": per_seed,
                "counted": counted,
                "target_met": len(pd["won"]) >= TARGET_SHARE * len(counted),
            }
    return {
        "domains": {
            "in_training": [d for d in domains if d in trained],
            "held_out": [d for d in domains if d not in trained],
        },
        "structural_ties": ties,
        "per_seed_perplexity": perplexity,
        "per_plan": per_plan,
        "headline": {
            v: {
                "weighting": bench.primary,
                "won": len(per_plan[v][bench.primary]["won"]),
                "won_raw": len(per_plan[v][bench.primary]["won_raw"]),
                "domains": len(per_plan[v][bench.primary]["counted"]),
                "ties_dropped": ties[v],
                "target": f">= {TARGET_SHARE:.0%} of the non-tied domains",
                "target_met": per_plan[v][bench.primary]["target_met"],
            }
            for v in HET
        },
    }


def regenerate(path: Path, allow_dirty: bool = False) -> None:
    """Re-analyse a committed result from its per-seed perplexities (no training); the runs' provenance is kept."""

    def figures(rec: dict) -> dict:
        bench = BenchConfig(**rec["config"]["bench"])
        cfgs = {v: compose_variant(bench, v, 0)[1] for v in VARIANTS}
        keep = {k: rec["figures"][k] for k in ("budget", "train_s", "eval_s") if k in rec["figures"]}
        return {**analyze(bench, cfgs, rec["figures"]["per_seed_perplexity"]), **keep}

    print(reanalyse(path, figures, text, plot, allow_dirty)["txt"].read_text())


def paired_diffs(runs: list[dict], plan: str, weighting: str, domains: list[str], ties: list[str] = ()) -> dict:
    """Per domain (homogeneous − plan) / homogeneous perplexity in %, paired per seed; won: mean > std and > 0
    (with one seed std is 0, so won is the raw count). Structural ties are shown but never won or lost."""
    diffs = {
        d: mean_std(
            [
                100
                * (r["perplexity"]["homogeneous"][d][weighting] - r["perplexity"][plan][d][weighting])
                / r["perplexity"]["homogeneous"][d][weighting]
                for r in runs
            ]
        )
        for d in domains
    }
    counted = [d for d in domains if d not in ties]
    return {
        "diff_pct": diffs,
        "won": [d for d in counted if diffs[d]["mean"] > max(diffs[d]["std"], 0.0)],
        "won_raw": [d for d in counted if diffs[d]["mean"] > 0],
        "mean_over_domains_pct": mean_std(
            [
                sum(
                    100
                    * (r["perplexity"]["homogeneous"][d][weighting] - r["perplexity"][plan][d][weighting])
                    / r["perplexity"]["homogeneous"][d][weighting]
                    for d in domains
                )
                / len(domains)
                for r in runs
            ]
        ),
    }


def scale_probe(
    bench: BenchConfig,
    budgets: list[int],
    nseeds: int,
    parallel: int,
    allow_dirty: bool,
    fresh: bool,
    smoke: bool = False,
) -> None:
    """homogeneous vs het_steps at several expert step budgets (same seed model steps), side by side."""
    variants = ["homogeneous", "het_steps"]
    benches = {s: dataclasses.replace(bench, steps=s, work_dir=f"{bench.work_dir}_probe/steps{s}") for s in budgets}
    for b in benches.values():
        for v in variants:
            check_plan(compose_variant(b, v, 0)[1])  # matched compute at every budget, before training anything
    config = {
        "bench": asdict(bench),
        "probe_steps_per_domain": budgets,
        "seeds": list(range(nseeds)),
        "variants": variants,
        "question": "at what expert step budget does heterogeneity (het_steps) start to beat homogeneous?",
    }
    hz = Harness("hdee_scale_probe", __file__, config, allow_dirty=allow_dirty, fresh=fresh, smoke=smoke)
    # seed-major, so a probe cut short still has every budget at the first seeds (re-run with fewer --seeds)
    jobs = [
        {"bench": asdict(benches[s]), "seed": seed, "variants": variants} for seed in range(nseeds) for s in budgets
    ]
    res = hz.run_jobs(jobs, run_seed, desc="hdee probe", parallel=parallel)
    cfg = compose_variant(bench, "homogeneous", 0)[1]
    domains = eval_domains(cfg)
    weightings = list(cfg.eval.weightings)
    per_budget = {}
    for s in budgets:
        runs = [r for j, r in zip(jobs, res) if j["bench"]["steps"] == s]
        per_budget[str(s)] = {
            "per_seed_perplexity": [r["perplexity"] for r in runs],
            "train_s": {v: mean_std([r["train_s"][v] for r in runs]) for v in variants},
            "het_steps": {w: paired_diffs(runs, "het_steps", w, domains) for w in weightings},
        }
    figures = {
        "domains": domains,
        "held_out": [d for d in domains if d not in plan_domains(cfg)],
        "primary": bench.primary,
        "per_budget": per_budget,
    }
    paths = hz.write(figures, probe_text, probe_plot)
    print(paths["txt"].read_text())


def probe_text(rec: dict) -> str:
    f, c = rec["figures"], rec["config"]
    w = f["primary"]
    budgets = list(f["per_budget"])
    lines = [
        header(rec),
        "",
        f"{c['question']}",
        f"seed model {c['bench']['seed_steps']} steps; training seeds {c['seeds']}; "
        f"het_steps lanes get 3:4:5 shares of the homogeneous 3 x steps; weighting {w}",
        "",
        "het_steps perplexity reduction vs homogeneous, % (paired per seed, mean ± std); * = won (mean > std); HO "
        "= held out",
        f"  {'domain':<16}" + "".join(f"{'steps/domain ' + b:>24}" for b in budgets),
    ]
    for d in f["domains"]:
        cells = []
        for b in budgets:
            r = f["per_budget"][b]["het_steps"][w]
            x = r["diff_pct"][d]
            cells.append(f"{x['mean']:+7.2f} ± {x['std']:5.2f}{'*' if d in r['won'] else ' '}")
        lines.append(f"  {d:<13}{' HO' if d in f['held_out'] else '   '}" + "".join(f"{x:>24}" for x in cells))
    lines.append(
        "  mean over domains "
        + "".join(f"{fmt(f['per_budget'][b]['het_steps'][w]['mean_over_domains_pct'], 2):>22}" for b in budgets)
    )
    lines.append("")
    for b in budgets:
        r = f["per_budget"][b]["het_steps"]
        lines.append(
            f"steps/domain {b}: het_steps wins {len(r[w]['won'])}/{len(f['domains'])} (raw {len(r[w]['won_raw'])}); "
            "other weightings: "
            + ", ".join(f"{k} {len(x['won'])} (raw {len(x['won_raw'])})" for k, x in r.items() if k != w)
            + "; train s: "
            + ", ".join(f"{v} {t['mean']:.0f}" for v, t in f["per_budget"][b]["train_s"].items())
        )
    return "\n".join(lines)


def probe_plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    f = rec["figures"]
    w = f["primary"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = np.arange(len(f["domains"]))
    budgets = list(f["per_budget"])
    width = 0.8 / len(budgets)
    for i, b in enumerate(budgets):
        r = f["per_budget"][b]["het_steps"][w]
        ax.bar(
            x + (i - (len(budgets) - 1) / 2) * width,
            [r["diff_pct"][d]["mean"] for d in f["domains"]],
            yerr=[r["diff_pct"][d]["std"] for d in f["domains"]],
            width=width,
            capsize=2,
            label=f"{b} steps/domain (won {len(r['won'])}/{len(f['domains'])})",
        )
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, [d + (" (HO)" if d in f["held_out"] else "") for d in f["domains"]], rotation=45, ha="right")
    ax.set_ylabel(f"het_steps gain vs homogeneous, % ({w})")
    ax.legend(fontsize=7)
    ax.set_title(f"HDEE scale probe, {len(rec['config']['seeds'])} seed(s) @ {rec['git_sha'][:10]}")
    fig.tight_layout()
    save_figure(fig, png, dpi=110)


def text(rec: dict) -> str:
    f, b = rec["figures"], rec["config"]["bench"]
    domains = f["domains"]["in_training"] + f["domains"]["held_out"]
    seed_domains = (
        rec["config"]
        .get("variants_seed0", {})
        .get("homogeneous", {})
        .get("plan", {})
        .get("seeds", [{}])[0]
        .get("domains")
    )
    lines = [header(rec)]
    if rec.get("analysis_git_sha"):
        lines.append(
            f"figures re-analysed from the committed per-seed perplexities at {rec['analysis_git_sha'][:12]} "
            f"(runs made at {rec['git_sha'][:12]})"
        )
    lines += [
        "",
        f"seed trained on {seed_domains}"
        + (
            ""
            if seed_domains == ["general"]
            else " (the expert domains themselves: the run predates the general-text seed)"
        ),
        f"seed steps {b['seed_steps']}, {b['steps']} steps per domain per expert (het_steps 3:4:5 of the same total), "
        f"test blocks per domain {b['eval_max_blocks'] or 'all'}, training seeds {rec['config']['seeds']}",
        "",
        "perplexity reduction vs homogeneous, % (paired per seed, mean ± std); * = won (mean > std); HO = held out",
    ]
    for w in next(iter(f["per_plan"].values())):
        lines.append(f"weighting {w}:")
        lines.append(f"  {'domain':<16}" + "".join(f"{v:>22}" for v in f["per_plan"]))
        for d in domains:
            cells = []
            for v in f["per_plan"]:
                x = f["per_plan"][v][w]["diff_pct"][d]
                cells.append(f"{x['mean']:+7.2f} ± {x['std']:5.2f}{'*' if d in f['per_plan'][v][w]['won'] else ' '}")
            lines.append(
                f"  {d:<13}{' HO' if d in f['domains']['held_out'] else '   '}" + "".join(f"{c:>22}" for c in cells)
            )
        for v in f["per_plan"]:
            r = f["per_plan"][v][w]
            n = len(r.get("counted", domains))
            lines.append(
                f"  {v}: won {len(r['won'])}/{n} (raw mean>0: {len(r['won_raw'])}/{n}; per seed {r['won_per_seed']})"
                + (
                    f"; structural ties dropped: {f['structural_ties'][v]}"
                    if f.get("structural_ties", {}).get(v)
                    else ""
                )
                + ("  target met" if r["target_met"] else "")
            )
    lines.append("")
    for v, h in f["headline"].items():
        lines.append(
            f"headline ({h['weighting']}): {v} wins {h['won']}/{h['domains']} (raw {h['won_raw']}"
            + (f"; ties dropped {h['ties_dropped']}" if h.get("ties_dropped") else "")
            + "), "
            f"target {h['target']} (paper 20/21): {'MET' if h['target_met'] else 'NOT MET'}"
        )
    lines.append(
        "train/eval seconds per seed (shared, loaded 2-core machine): "
        + ", ".join(f"{v} {f['train_s'][v]['mean']:.0f}/{f['eval_s'][v]['mean']:.0f}" for v in f["train_s"])
    )
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    f = rec["figures"]
    domains = f["domains"]["in_training"] + f["domains"]["held_out"]
    weightings = list(next(iter(f["per_plan"].values())))
    fig, axes = plt.subplots(1, len(weightings), figsize=(4.2 * len(weightings), 4.2), sharey=True)
    x = np.arange(len(domains))
    for ax, w in zip(np.atleast_1d(axes), weightings):
        for i, v in enumerate(f["per_plan"]):
            d = f["per_plan"][v][w]["diff_pct"]
            ax.bar(
                x + (i - 0.5) * 0.38,
                [d[k]["mean"] for k in domains],
                yerr=[d[k]["std"] for k in domains],
                width=0.38,
                capsize=2,
                label=f"{v} (won {len(f['per_plan'][v][w]['won'])}/{len(domains)})",
            )
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(
            x, [d + (" (HO)" if d in f["domains"]["held_out"] else "") for d in domains], rotation=45, ha="right"
        )
        ax.set_title(f"weighting: {w}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("perplexity reduction vs homogeneous (%), mean ± std over seeds")
    fig.suptitle(f"HDEE per plan, {len(rec['config']['seeds'])} seeds, matched compute @ {rec['git_sha'][:10]}")
    fig.tight_layout()
    save_figure(fig, png, dpi=110)


if __name__ == "__main__":
    main()
