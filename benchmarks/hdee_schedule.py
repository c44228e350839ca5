"""hdee_schedule: heterogeneous-steps vs homogeneous HDEE ensembles at the paper's schedule, scaled down.

The paper's protocol (arXiv HDEE; gensyn-ai/hdee), and what this run does with it:
  - the seed is trained far longer than a domain phase (paper 20k : 400 steps; here `seed_steps`
    against 8-32 steps per domain, 12-50 : 1), once, and shared by every plan, budget and seed;
  - the domain phase is continued pre-training at a 10x lower lr (paper 6e-5 -> 3e-5) with a short
    warm-up (paper 50 of 400 steps: 1/8 of the phase here), `conf/hdee_plan/*_schedule.yaml`'s expert_optim;
  - the heterogeneous experts are checkpoints of ONE cosine per domain phase (paper: 300/400/500 steps
    inside a 600-step cosine; here 3:4:5 shares inside 1.5x the homogeneous steps); the homogeneous
    experts stop at 1x inside the same schedule (`plan.domain_schedule_steps`);
  - lanes hold disjoint domains: the six training domains ranked by the seed's validation loss
    (the stated difficulty rule), the two easiest to the 3-share lane, the two hardest to the 5-share
    lane; python_tests is held out (no seed or expert trains on it).
Seeds (`--seeds`) change the experts' data order (train.seed), not the seed model.

Statistics per budget: per-seed raw win counts over the 7 domains (the paper's statistic: het
perplexity below homogeneous), the paired mean delta log-perplexity over domains (het - homogeneous;
negative favours het), a two-sided sign test over all (domain, seed) pairs, and the trend of the mean
delta over the budgets. Departures: a ~1M-param byte Llama and ~200 kB per domain instead of 125M+
models on the paper's corpora; 3 experts; one seed model; het_sizes not run (it needs one long
seed per width, three times the seed compute).

    python -m benchmarks.hdee_schedule                        # 3 budgets x 3 seeds
    python -m benchmarks.hdee_schedule --budgets 8 --seeds 1 --seed-steps 40 --allow-dirty   # smoke
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks.harness import Harness, fmt, header, mean_std, config_parser, parse_config
from decentrain.algorithms.common.trainer import evaluate
from decentrain.algorithms.hdee.config import check_plan, hdee_config_from_dict
from decentrain.algorithms.hdee.evaluate import EnsembleScorer
from decentrain.algorithms.hdee.plan import LaneConfig
from decentrain.algorithms.hdee.train import model_dir, run_stage
from decentrain.config import register_hdee_configs
from decentrain.core.world import World
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PLANS = ("homogeneous", "het_steps")
SHARES = (3, 4, 5)  # the paper's 300/400/500
HELD_OUT = "python_tests"
PRIMARY = "cached"


@dataclass
class BenchConfig:
    seed_steps: int = 400
    budgets: str = "8,16,32"  # homogeneous steps per domain; het_steps gets 3:4:5 shares of the same total
    schedule_factor: float = 1.5  # the shared cosine spans this x the homogeneous steps (paper 600 / 400)
    warmup_fraction: float = 0.125  # of the homogeneous steps (paper 50 / 400)
    eval_max_blocks: int = 16  # test blocks per domain
    work_dir: str = "runs/bench/hdee_schedule"


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        raw = OmegaConf.to_container(compose("hdee", overrides=overrides), resolve=True)
    return hdee_config_from_dict(raw)


def base_config(b: BenchConfig, ensemble_dir: Path, seed: int = 0):
    return _compose(["hdee_plan=homogeneous_schedule", f"ensemble_dir={ensemble_dir}", f"train.seed={seed}",
                     f"plan.seeds.0.steps={b.seed_steps}", f"eval.max_blocks={b.eval_max_blocks}"])


def plan_config(b: BenchConfig, variant: str, budget: int, lanes_domains: list[list[str]], seed: int):
    """The homogeneous or het_steps config at `budget` steps per domain, lanes from the difficulty ranking."""
    cfg = base_config(b, ROOT / b.work_dir / f"steps{budget}" / f"seed{seed}" / variant, seed)
    het = [round(3 * budget * s / sum(SHARES)) for s in SHARES]
    lanes = [LaneConfig(domains=list(ds), steps=[het[k] if variant == "het_steps" else budget] * len(ds), size="M",
                        intermediate_size=cfg.plan.seeds[0].intermediate_size, seed=cfg.plan.seeds[0].name)
             for k, ds in enumerate(lanes_domains)]
    plan = dataclasses.replace(cfg.plan, lanes=lanes, domain_schedule_steps=math.ceil(b.schedule_factor * budget))
    optim = dataclasses.replace(cfg.expert_optim, warmup_steps=max(1, round(b.warmup_fraction * budget)))
    return dataclasses.replace(cfg, plan=plan, expert_optim=optim,
                               budget=dataclasses.replace(cfg.budget, baseline_steps_per_domain=budget))


def train_seed_model(b: BenchConfig) -> dict:
    """The shared seed (trained once), and its validation loss per training domain: the difficulty ranking."""
    cfg = base_config(b, ROOT / b.work_dir / "seed_model")
    with contextlib.redirect_stdout(io.StringIO()):
        run_stage(dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, stage="seeds")), World())
    seed = cfg.plan.seeds[0]
    path = model_dir(cfg.ensemble_dir, seed.name)
    mcfg = ModelConfig(**{**asdict(cfg.model), "pretrained": str(path), "tokenizer": str(path)})
    tok = build_tokenizer(mcfg)
    model = build_model(mcfg, tok)
    corpus = build_corpus(dataclasses.replace(cfg.data, domains=list(seed.domains)), tok)
    val_loss = evaluate(model, {d: corpus.split("val", d) for d in seed.domains}, 16, torch.device("cpu"))
    return {"path": str(path), "val_loss": {d: float(v) for d, v in val_loss.items()}}


def lanes_by_difficulty(val_loss: dict[str, float]) -> list[list[str]]:
    """Domains sorted by the seed's validation loss, easiest first, two per lane: lane k gets share SHARES[k]."""
    ranked = sorted(val_loss, key=val_loss.get)
    per = len(ranked) // len(SHARES)
    return [ranked[k * per:(k + 1) * per] for k in range(len(SHARES))]


def run_job(job: dict) -> dict:
    """Both plans at one budget and seed, branched from the shared seed model; perplexity per domain."""
    b, budget, seed = BenchConfig(**job["bench"]), job["budget"], job["seed"]
    torch.set_num_threads(1)
    out: dict = {"perplexity": {}, "experts": {}, "train_s": {}}
    for v in PLANS:
        cfg = plan_config(b, v, budget, job["lanes"], seed)
        out.setdefault("vs_baseline", {})[v] = check_plan(cfg)  # matched compute, before training
        dst = model_dir(cfg.ensemble_dir, cfg.plan.seeds[0].name)
        shutil.rmtree(cfg.ensemble_dir, ignore_errors=True)  # only the harness cache resumes
        shutil.copytree(job["seed_model"], dst)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            run_stage(dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, stage="lanes")), World())
        out["train_s"][v] = time.perf_counter() - t0
        res = EnsembleScorer(cfg, World()).evaluate()
        out["perplexity"][v] = {d: r["weightings"] for d, r in res.items()}
        out["experts"][v] = {d: r["experts"] for d, r in res.items()}
    return out


def sign_test(deltas: list[float]) -> dict:
    """Two-sided exact sign test of the deltas against 0 (ties dropped)."""
    neg, pos = sum(d < 0 for d in deltas), sum(d > 0 for d in deltas)
    n = neg + pos
    k = min(neg, pos)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return {"het_better": neg, "het_worse": pos, "p_two_sided": p}


def budget_stats(runs: list[dict], weighting: str) -> dict:
    domains = list(runs[0]["perplexity"]["homogeneous"])
    dlog = [[math.log(r["perplexity"]["het_steps"][d][weighting]) - math.log(r["perplexity"]["homogeneous"][d][weighting])
             for d in domains] for r in runs]  # [seed][domain]
    return {
        "domains": domains,
        "wins_per_seed": [sum(x < 0 for x in row) for row in dlog],
        "mean_dlogppl_per_seed": [float(np.mean(row)) for row in dlog],
        "mean_dlogppl": mean_std([float(np.mean(row)) for row in dlog]),
        "dlogppl_per_domain": {d: mean_std([row[i] for row in dlog]) for i, d in enumerate(domains)},
        "sign_test": sign_test([x for row in dlog for x in row]),
    }


def main() -> None:
    ap = config_parser(BenchConfig, __doc__)
    ap.add_argument("--parallel", type=int, default=1)
    b, nseeds, allow_dirty, fresh, parallel = parse_config(ap, BenchConfig, "parallel")
    register_hdee_configs()
    budgets = [int(x) for x in b.budgets.split(",")]
    hz = Harness("hdee_schedule", __file__, {"bench": asdict(b), "seeds": list(range(nseeds))}, allow_dirty=allow_dirty, fresh=fresh)
    seed_job = hz.run_jobs([{"bench": asdict(b), "stage": "seed_model"}], lambda j: train_seed_model(BenchConfig(**j["bench"])), "seed model")[0]
    if not Path(seed_job["path"]).exists():  # the cached record outlived runs/: train it again
        seed_job = train_seed_model(b)
    lanes = lanes_by_difficulty(seed_job["val_loss"])
    jobs = [{"bench": asdict(b), "budget": s, "seed": seed, "lanes": lanes, "seed_model": seed_job["path"]}
            for seed in range(nseeds) for s in budgets]
    res = hz.run_jobs(jobs, run_job, desc="hdee schedule", parallel=parallel)
    per_budget = {}
    for s in budgets:
        runs = [r for j, r in zip(jobs, res) if j["budget"] == s]
        weightings = list(next(iter(runs[0]["perplexity"]["homogeneous"].values())))
        per_budget[str(s)] = {"stats": {w: budget_stats(runs, w) for w in weightings},
                              "per_seed_perplexity": [r["perplexity"] for r in runs],
                              "per_seed_experts": [r["experts"] for r in runs],
                              "vs_baseline": runs[0]["vs_baseline"],
                              "train_s": {v: mean_std([r["train_s"][v] for r in runs]) for v in PLANS}}
    means = [per_budget[str(s)]["stats"][PRIMARY]["mean_dlogppl"]["mean"] for s in budgets]
    slope = float(np.polyfit(np.log2(budgets), means, 1)[0]) if len(budgets) > 1 else None
    figures = {"seed_val_loss": seed_job["val_loss"], "lanes": [{"domains": ds, "share": sh} for ds, sh in zip(lanes, SHARES)],
               "held_out": HELD_OUT, "primary": PRIMARY, "per_budget": per_budget,
               "trend": {"budgets": budgets, "mean_dlogppl": means, "slope_per_doubling": slope},
               "target": "each het plan wins >= 80% of domains per seed with a negative paired mean delta log-ppl"}
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


def text(rec: dict) -> str:
    f, b = rec["figures"], rec["config"]["bench"]
    w = f["primary"]
    lines = [header(rec), "",
             f"seed model {b['seed_steps']} steps (shared); domain phase at the seed lr / 10, warm-up {b['warmup_fraction']:.3g} of the "
             f"homogeneous steps, every expert a checkpoint of one {b['schedule_factor']}x cosine; training seeds {rec['config']['seeds']}",
             "lanes (ranked by the seed's validation loss, easiest first): " + "; ".join(
                 f"{lane['share']} shares: " + ", ".join(f"{d} ({f['seed_val_loss'][d]:.3f})" for d in lane["domains"]) for lane in f["lanes"])
             + f"; held out: {f['held_out']}", "",
             f"het_steps vs homogeneous, weighting {w}: delta log-perplexity (het - homogeneous; < 0 favours het)",
             "| steps/domain (hom; het 3:4:5) | wins per seed (of 7) | paired mean delta log-ppl over domains | sign test het better/worse, p |",
             "|---|---|---|---|"]
    for s, r in f["per_budget"].items():
        st = r["stats"][w]
        t = st["sign_test"]
        lines.append(f"| {s} | {st['wins_per_seed']} | {fmt(st['mean_dlogppl'], 4)} | {t['het_better']}/{t['het_worse']}, p={t['p_two_sided']:.3f} |")
    tr = f["trend"]
    lines += ["", "trend of the mean delta over budgets: " + ", ".join(f"{s}: {m:+.4f}" for s, m in zip(tr["budgets"], tr["mean_dlogppl"]))
              + (f"; slope {tr['slope_per_doubling']:+.4f} per doubling of steps" if tr["slope_per_doubling"] is not None else ""),
              "", "per domain (mean ± std over seeds of delta log-ppl, weighting " + w + "):"]
    budgets = list(f["per_budget"])
    lines.append(f"  {'domain':<16}" + "".join(f"{'steps ' + s:>22}" for s in budgets))
    for d in f["per_budget"][budgets[0]]["stats"][w]["domains"]:
        lines.append(f"  {d + (' HO' if d == f['held_out'] else ''):<16}" + "".join(
            f"{fmt(f['per_budget'][s]['stats'][w]['dlogppl_per_domain'][d], 4):>22}" for s in budgets))
    lines.append("")
    for s in budgets:
        other = {k: v for k, v in f["per_budget"][s]["stats"].items() if k != w}
        lines.append(f"steps {s}, other weightings: " + "; ".join(
            f"{k}: wins {v['wins_per_seed']}, mean {v['mean_dlogppl']['mean']:+.4f}" for k, v in other.items()))
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    w = f["primary"]
    budgets = list(f["per_budget"])
    fig, (a, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    domains = f["per_budget"][budgets[0]]["stats"][w]["domains"]
    x = np.arange(len(domains))
    width = 0.8 / len(budgets)
    for i, s in enumerate(budgets):
        d = f["per_budget"][s]["stats"][w]["dlogppl_per_domain"]
        a.bar(x + (i - (len(budgets) - 1) / 2) * width, [d[k]["mean"] for k in domains], yerr=[d[k]["std"] for k in domains],
              width=width, capsize=2, label=f"{s} steps/domain")
    a.axhline(0, color="k", lw=0.8)
    a.set_xticks(x, [d + (" (HO)" if d == f["held_out"] else "") for d in domains], rotation=45, ha="right")
    a.set_ylabel(f"delta log-ppl het_steps - homogeneous ({w})")
    a.legend(fontsize=7)
    m = [f["per_budget"][s]["stats"][w]["mean_dlogppl"] for s in budgets]
    bx.errorbar([int(s) for s in budgets], [v["mean"] for v in m], yerr=[v["std"] for v in m], marker="o", capsize=3)
    bx.axhline(0, color="k", lw=0.8)
    bx.set_xscale("log", base=2)
    bx.set(xlabel="homogeneous steps per domain", ylabel="paired mean delta log-ppl over domains", title="trend over budgets")
    fig.suptitle(f"HDEE at the paper's schedule (scaled down), {len(rec['config']['seeds'])} seeds @ {rec['git_sha'][:10]}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
