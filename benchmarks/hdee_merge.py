"""hdee_merge: HDEE experts merged into one routed model (DUME, arXiv 2603.29765) vs the ensemble, per domain.

The experts are the ones `benchmarks.hdee_schedule` trained (its run dirs under runs/, and its
result JSON for the lanes and the ensemble's figures): per training seed, the homogeneous plan's
three final experts, branched from one general-text seed. Per seed, `recipes.hdee_merge`'s library
path (`hdee.merge.build_routed`) fits the ridge router on `calibration_blocks` validation blocks per
expert domain (the seed's last hidden state, causal running mean), experts frozen; the router's
lambda is chosen on the tuning seed (0) from a bracketing grid by the routed model's log-perplexity
on the next `tune_blocks` validation blocks per domain (never the test split), and used on every seed.

On the same test blocks as the ensemble (the first `eval_max_blocks` test blocks per domain), per
domain and seed, test log-perplexity of:
  - routed (running-mean and per-token routing),
  - the ensemble's weightings (uniform, cached prior, top-1, plain average; from hdee_schedule's run),
  - the expert trained on the domain (oracle routing, the routed model's ceiling), the best single
    expert over all domains (one model, no routing), and the seed;
beside each, the inference cost in model forward passes per token: routed = 1 (the seed backbone,
the router's features) + the distinct experts a sequence routes to (a KV-cached decoder runs each
of them); ensemble = 3 experts; one expert or the seed = 1. Quality retained, DUME's statistic:
(seed - routed) / (seed - own-domain expert) log-ppl gain, on the expert domains.

Departures (DUME upcycles the experts into one MoE with per-layer ridge routers over shared
attention; here whole experts are routed by one router over the seed's hidden states) are listed
in decentrain/algorithms/hdee/routed.py.

    python -m benchmarks.hdee_schedule --seed-steps 80 --budgets 8 --parallel 3   # first: trains the experts
    python -m benchmarks.hdee_merge --budget 8 --parallel 3                      # the committed run
    python -m benchmarks.hdee_merge --reanalyse                                  # its figures again from the record
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import (
    RESULTS,
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
PLAN = "homogeneous"
ARMS = ("running_mean", "token")  # routed poolings
ENSEMBLE_RULE = DecisionRule("reaches", margin=0.01)  # "routed ≈ ensemble": TOST within ±1 % of the ensemble's log-ppl
# the committed record's command (it predates the harness keeping one): its experts are hdee_schedule @ fbcff7e's,
# `python -m benchmarks.hdee_schedule --seed-steps 80 --budgets 8 --parallel 3` (80-step seeds; the schedule JSON now
# holds a later run, so re-running this today merges other experts)
COMMITTED_COMMAND = "python -m benchmarks.hdee_merge --budget 8 --parallel 3"


@dataclass
class BenchConfig:
    budget: int = 16  # hdee_schedule's steps per domain whose experts are merged
    calibration_blocks: int = 8  # per expert domain, from the validation split
    tune_blocks: int = 8  # per domain, the validation blocks after the calibration ones
    # the grid for the ridge lambda (large lambda: W -> the class sums H^T Y / lambda)
    lambdas: str = "0.0001,0.01,1,100,10000"
    eval_max_blocks: int = 16  # test blocks per domain: hdee_schedule's
    schedule_json: str = "benchmarks/results/hdee_schedule.json"  # the hdee_schedule result whose experts are merged


def _schedule(b: BenchConfig) -> dict:
    path = ROOT / b.schedule_json
    if not path.exists():
        raise SystemExit(
            "benchmarks/results/hdee_schedule.json is missing: run `python -m benchmarks.hdee_schedule` first"
        )
    return json.loads(path.read_text())


def merge_config(sched: dict, budget: int, seed: int, b: BenchConfig, lam: float, pooling: str):
    """The MergeConfig of one seed's homogeneous ensemble: its seed model, lanes' final experts and corpus."""
    from benchmarks import hdee_schedule as H
    from decentrain.algorithms.hdee.merge import ExpertSource, MergeConfig
    from decentrain.algorithms.hdee.train import model_dir
    from decentrain.config import register_configs

    register_configs("hdee")

    sb = H.BenchConfig(**sched["config"]["bench"])
    lanes = [lane["domains"] for lane in sched["figures"]["lanes"]]
    cfg = H.plan_config(sb, PLAN, budget, lanes, seed)
    experts = [
        ExpertSource(n, str(model_dir(cfg.ensemble_dir, n)), list(ds)) for n, ds in zip(cfg.plan.final_experts(), lanes)
    ]
    return MergeConfig(
        backbone=str(model_dir(cfg.ensemble_dir, cfg.plan.seeds[0].name)),
        experts=experts,
        data=cfg.data,
        calibration_blocks=b.calibration_blocks,
        ridge_lambda=lam,
        pooling=pooling,
    ), cfg


@torch.no_grad()
def expert_logprobs(model, blocks: torch.Tensor) -> torch.Tensor:
    """[K, B, T-1] each frozen expert's token log-probs: computed once, whatever the router."""
    from decentrain.core.comm.ensemble import token_logprobs

    return torch.stack([token_logprobs(e, blocks) for e in model.experts]).double()


@torch.no_grad()
def routed_score(model, blocks: torch.Tensor, expert_lp: torch.Tensor) -> tuple[float, float]:
    """(test log-ppl as the ensemble counts it, distinct experts per sequence): the routed model's log-prob of
    token t+1 is its chosen expert's, `model.choices` at position t (what its forward gathers)."""
    k = model.choices(blocks)[:, :-1]
    lp = expert_lp.gather(0, k[None]).squeeze(0)
    return float(-lp.sum() / lp.numel()), float(model.experts_run(blocks[:, :-1]).mean())


def run_job(job: dict) -> dict:
    """One seed: the routed model (each pooling) built once through hdee.merge, scored on validation
    blocks at every lambda (tuning job) or on the test blocks at the chosen lambda."""
    from decentrain.algorithms.hdee.config import eval_domains
    from decentrain.algorithms.hdee.merge import build_routed, calibration_blocks
    from decentrain.core.comm.ensemble import token_logprobs
    from decentrain.data.blocks import build_corpus

    torch.set_num_threads(1)
    b, seed = BenchConfig(**job["bench"]), job["seed"]
    sched = _schedule(b)
    lams = job.get("lambda") or {p: 1.0 for p in ARMS}
    mcfg, hcfg = merge_config(sched, b.budget, seed, b, float(lams[ARMS[0]]), ARMS[0])
    model, tok = build_routed(mcfg)
    calib = calibration_blocks(mcfg, tok)
    corpus = build_corpus(dataclasses.replace(hcfg.data, domains=eval_domains(hcfg)), tok)
    out: dict = {
        "tuning": {},
        "routed": {},
        "router_shape": list(model.router_weight.shape),
        "calibration_tokens": int(model.router_counts.sum()),
    }
    if job.get("tune"):
        expert_domains = [d for e in mcfg.experts for d in e.domains]
        val = {
            d: corpus.split("val", d)[b.calibration_blocks : b.calibration_blocks + b.tune_blocks]
            for d in expert_domains
        }
        lps = {d: expert_logprobs(model, v) for d, v in val.items()}
        for pooling in ARMS:
            model.recalibrate(calib, pooling)
            rows = {}
            for lam in [float(x) for x in b.lambdas.split(",")]:  # one d x d solve each, no text read again
                model.config.ridge_lambda = lam
                model.refit()
                rows[str(lam)] = float(np.mean([routed_score(model, val[d], lps[d])[0] for d in val]))
            out["tuning"][pooling] = rows
        return out
    test = {d: corpus.split("test", d)[: b.eval_max_blocks] for d in eval_domains(hcfg)}
    lps = {d: expert_logprobs(model, x) for d, x in test.items()}
    for pooling in ARMS:
        model.config.ridge_lambda = float(lams[pooling])
        model.recalibrate(calib, pooling)
        out["routed"][pooling] = {
            d: dict(zip(("logppl", "experts_run"), routed_score(model, x, lps[d]))) for d, x in test.items()
        }
        # The shortcut above is the model's own forward: checked on one domain per pooling.
        d0 = next(iter(test))
        with torch.no_grad():
            ref = -token_logprobs(model, test[d0]).double().mean().item()
        if abs(ref - out["routed"][pooling][d0]["logppl"]) > 1e-5:
            raise RuntimeError(f"routed log-ppl shortcut {out['routed'][pooling][d0]['logppl']} != forward {ref}")
    return out


def pick_lambda(tuning: dict) -> dict:
    """The grid's best lambda per pooling, and whether it sits on the grid's edge (then the grid must widen)."""
    out = {}
    for pooling, rows in tuning.items():
        lams = list(rows)
        best = min(lams, key=rows.get)
        out[pooling] = {"lambda": float(best), "on_edge": best in (lams[0], lams[-1]), "val_logppl": rows}
    return out


def analyze(b: BenchConfig, sched: dict, runs: list[dict], seeds: list[int]) -> dict:
    per = sched["figures"]["per_budget"][str(b.budget)]
    lanes = [lane["domains"] for lane in sched["figures"]["lanes"]]
    owner = {d: k for k, ds in enumerate(lanes) for d in ds}
    domains = list(runs[0]["routed"][ARMS[0]])
    seed_lp = sched["figures"]["seed_test_logppl"]
    rows: dict = {}
    for d in domains:
        r: dict = {}
        for pooling in ARMS:
            r[f"routed_{pooling}"] = mean_std([run["routed"][pooling][d]["logppl"] for run in runs])
            r[f"cost_routed_{pooling}"] = 1 + float(np.mean([run["routed"][pooling][d]["experts_run"] for run in runs]))
        for w in ("uniform", "cached", "topk", "average"):
            r[f"ensemble_{w}"] = mean_std([math.log(p[PLAN][d][w]) for p in per["per_seed_perplexity"][: len(runs)]])
        experts = per["per_seed_experts"][: len(runs)]
        names = list(experts[0][PLAN][d])
        if d in owner:
            r["own_expert"] = mean_std([math.log(e[PLAN][d][names[owner[d]]]) for e in experts])
        r["seed"] = seed_lp[d]
        rows[d] = r
    # The best single expert: the one with the lowest mean log-ppl over every domain (one model, no routing).
    names = list(per["per_seed_experts"][0][PLAN][domains[0]])
    mean_over = {
        n: np.mean([math.log(e[PLAN][d][n]) for e in per["per_seed_experts"][: len(runs)] for d in domains])
        for n in names
    }
    best = min(mean_over, key=mean_over.get)
    for d in domains:
        rows[d]["best_single_expert"] = mean_std(
            [math.log(e[PLAN][d][best]) for e in per["per_seed_experts"][: len(runs)]]
        )
    return {
        "domains": domains,
        "held_out": [d for d in domains if d not in owner],
        "best_single_expert": best,
        "per_domain": rows,
        **verdicts(rows, [d for d in domains if d in owner], domains),
        "cost": {
            "ensemble": len(names),
            "single_expert": 1,
            "seed": 1,
            **{f"routed_{p}": float(np.mean([rows[d][f"cost_routed_{p}"] for d in domains])) for p in ARMS},
        },
    }


def verdicts(rows: dict, trained: list[str], domains: list[str]) -> dict:
    """Quality retained (DUME's statistic) both ways, a ratio of summed gains beside the mean of per-domain ratios
    (one domain's large ratio lifts the mean), and routed against the ensemble's cached weighting, paired by seed
    over domains and decided by TOST within ±1 % (benchmarks/protocol.py). Reads the per-domain rows alone."""
    out: dict = {
        "quality_retained": {},
        "quality_retained_summed": {},
        "quality_retained_per_domain": {},
        "vs_ensemble_cached": {},
        "decisions": {},
    }
    seeds = range(rows[domains[0]]["routed_" + ARMS[0]]["n"])
    for p in ARMS:
        gain = {d: rows[d]["seed"] - rows[d][f"routed_{p}"]["mean"] for d in trained}
        own = {d: rows[d]["seed"] - rows[d]["own_expert"]["mean"] for d in trained}
        out["quality_retained_per_domain"][p] = {d: gain[d] / own[d] for d in trained}
        out["quality_retained"][p] = float(np.mean(list(out["quality_retained_per_domain"][p].values())))
        out["quality_retained_summed"][p] = sum(gain.values()) / sum(own.values())
        routed = [float(np.mean([rows[d][f"routed_{p}"]["values"][i] for d in domains])) for i in seeds]
        ens = [float(np.mean([rows[d]["ensemble_cached"]["values"][i] for d in domains])) for i in seeds]
        diffs = [
            rows[d][f"routed_{p}"]["values"][i] - rows[d]["ensemble_cached"]["values"][i]
            for i in seeds
            for d in domains
        ]
        out["vs_ensemble_cached"][p] = {
            "mean_over_domains": mean_std([a - b for a, b in zip(routed, ens)]),
            "routed_better": sum(x < 0 for x in diffs),
            "pairs": len(diffs),
        }
        out["decisions"][f"routed_{p}_reaches_ensemble"] = decision(
            f"routed_{p}_reaches_ensemble",
            f"routed ({p})",
            "ensemble (cached prior)",
            ENSEMBLE_RULE,
            routed,
            ens,
            "test log-ppl, mean over domains, per seed",
        )
    return out


def figures_of(rec: dict) -> dict:
    """The figures again from the record's own per-domain rows (nothing re-run)."""
    f = rec["figures"]
    trained = [d for d in f["domains"] if d not in f["held_out"]]
    return {**f, **verdicts(f["per_domain"], trained, f["domains"])}


def main() -> None:
    ap = config_parser(BenchConfig, __doc__)
    ap.add_argument("--parallel", type=int, default=1, help="seeds merged and scored at once (processes)")
    ap.add_argument("--reanalyse", action="store_true", help="recompute the committed result's figures from its rows")
    b, nseeds, allow_dirty, fresh, parallel, smoke, again = parse_config(
        ap, BenchConfig, "parallel", "smoke", "reanalyse"
    )
    if again:
        path = RESULTS / "hdee_merge.json"
        rec = json.loads(path.read_text())
        if rec.get("command") is None:  # recorded before commands were kept: the one it ran under (commit 5e7c919)
            rec["command"] = COMMITTED_COMMAND
            path.write_text(json.dumps(rec, indent=2))
        print(reanalyse(path, figures_of, text, plot, allow_dirty=allow_dirty)["txt"].read_text())
        return
    sched = _schedule(b)
    seeds = list(range(nseeds))
    hz = Harness(
        "hdee_merge",
        __file__,
        {
            "bench": asdict(b),
            "seeds": seeds,
            "experts_from": {
                "hdee_schedule_git_sha": sched["git_sha"],
                "plan": PLAN,
                "lanes": sched["figures"]["lanes"],
            },
        },
        allow_dirty=allow_dirty,
        fresh=fresh,
        smoke=smoke,
    )
    tune = hz.run_jobs(
        [{"bench": asdict(b), "seed": 0, "tune": True, "schedule_sha": sched["git_sha"]}], run_job, "tune lambda"
    )[0]
    chosen = pick_lambda(tune["tuning"])
    jobs = [
        {
            "bench": asdict(b),
            "seed": s,
            "lambda": {p: c["lambda"] for p, c in chosen.items()},
            "schedule_sha": sched["git_sha"],
        }
        for s in seeds
    ]
    runs = hz.run_jobs(jobs, run_job, desc="hdee merge", parallel=parallel)
    figures = {
        "lambda": chosen,
        **analyze(b, sched, runs, seeds),
        "router_shape": runs[0]["router_shape"],
        "calibration_tokens": runs[0]["calibration_tokens"],
        "experts_from": {"benchmark": "hdee_schedule", "git_sha": sched["git_sha"], "plan": PLAN, "budget": b.budget},
    }
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


def text(rec: dict) -> str:
    f, b = rec["figures"], rec["config"]["bench"]
    cols = [f"routed_{p}" for p in ARMS] + [
        "ensemble_cached",
        "ensemble_uniform",
        "ensemble_topk",
        "ensemble_average",
        "own_expert",
        "best_single_expert",
        "seed",
    ]
    cost = f["cost"]
    costs = {
        **{f"routed_{p}": f"{cost[f'routed_{p}']:.2f}" for p in ARMS},
        **{c: str(cost["ensemble"]) for c in cols if c.startswith("ensemble")},
        "own_expert": "1 (oracle)",
        "best_single_expert": "1",
        "seed": "1",
    }
    lines = [
        header(rec),
        "",
        f"experts: hdee_schedule's {f['experts_from']['plan']} plan at {f['experts_from']['budget']} steps/domain "
        f"(@ {f['experts_from']['git_sha'][:10]}), seeds {rec['config']['seeds']}; router: ridge on the seed's "
        f"last hidden state, {b['calibration_blocks']} validation blocks per expert domain "
        f"({f['calibration_tokens']} tokens), W {f['router_shape']}; "
        "lambda per pooling from the grid "
        + ", ".join(f"{p}: {c['lambda']:g}{' (ON THE EDGE)' if c['on_edge'] else ''}" for p, c in f["lambda"].items())
        + " (tuning seed 0, validation blocks)",
        f"best single expert (lowest mean log-ppl over all domains): {f['best_single_expert']}",
        "",
        "test log-perplexity per domain (mean ± std over seeds; lower is better); HO = held out (no expert trained "
        "on it)",
        "| domain | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
        "| cost: model passes per token | " + " | ".join(costs[c] for c in cols) + " |",
    ]
    for d, r in f["per_domain"].items():
        cells = [("-" if c not in r else f"{r[c]:.4f}" if isinstance(r[c], float) else fmt(r[c], 4)) for c in cols]
        lines.append(f"| {d}{' HO' if d in f['held_out'] else ''} | " + " | ".join(cells) + " |")
    summed = f.get("quality_retained_summed", {})
    lines += [
        "",
        "quality retained on the expert domains, (seed - routed) / (seed - own-domain expert) log-ppl gain (DUME "
        "reports up to 97.6 %): "
        + ", ".join(
            f"{p} {v:.1%} as the ratio of summed gains, {f['quality_retained'][p]:.1%} as the mean of per-domain ratios"
            + (
                " (" + ", ".join(f"{d} {x:.0%}" for d, x in f["quality_retained_per_domain"][p].items()) + ")"
                if "quality_retained_per_domain" in f
                else ""
            )
            for p, v in summed.items()
        ),
        "routed minus the ensemble's cached weighting, paired by seed over domains: "
        + "; ".join(
            f"{p}: mean {fmt(v['mean_over_domains'], 4)} log-ppl, routed better in "
            f"{v['routed_better']}/{v['pairs']} (domain, seed) pairs"
            for p, v in f["vs_ensemble_cached"].items()
        ),
        "decision, routed ≈ ensemble (TOST within ±1 % of the ensemble's log-ppl, paired by seed; "
        "benchmarks/protocol.py): "
        + "; ".join(f"{p}: {describe(d['result'], 4)}" for p, d in f.get("decisions", {}).items()),
        "cost: the routed model runs the seed (router features) plus the distinct experts each sequence routes to; "
        "the ensemble runs every expert on every token; own_expert is the oracle (the domain's label picks the expert)",
    ]
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    domains = f["domains"]
    cols = [f"routed_{p}" for p in ARMS] + ["ensemble_cached", "own_expert", "best_single_expert"]
    fig, (a, bx) = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    x = np.arange(len(domains))
    w = 0.8 / len(cols)
    for i, c in enumerate(cols):
        vals = [f["per_domain"][d].get(c) for d in domains]
        a.bar(
            x + (i - (len(cols) - 1) / 2) * w,
            [v["mean"] - f["per_domain"][d]["seed"] if v else 0 for v, d in zip(vals, domains)],
            yerr=[v["std"] if v else 0 for v in vals],
            width=w,
            capsize=2,
            label=c,
        )
    a.axhline(0, color="k", lw=0.6)
    a.set_xticks(x, [d + (" (HO)" if d in f["held_out"] else "") for d in domains], rotation=30, ha="right")
    a.set(ylabel="test log-ppl minus the seed's (lower is better)", title="quality per domain")
    a.legend(fontsize=7)
    cost = f["cost"]
    names = [f"routed_{p}" for p in ARMS] + ["ensemble", "single_expert"]
    bx.bar(names, [cost[n] for n in names])
    bx.set(ylabel="model passes per token", title="inference cost")
    bx.tick_params(axis="x", rotation=30)
    for ax in (a, bx):
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"HDEE experts merged into one routed model, {len(rec['config']['seeds'])} seeds @ {rec['git_sha'][:10]}"
    )
    fig.tight_layout()
    save_figure(fig, png, dpi=110)


if __name__ == "__main__":
    main()
