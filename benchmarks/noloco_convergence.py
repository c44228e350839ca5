"""noloco_convergence: NoLoCo at H against DiLoCo at 2H (the NoLoCo paper's protocol), DDP as the reference.

Protocol (the NoLoCo paper's released configs run NoLoCo at H=50 against DiLoCo at H=100,
each at its own defaults, DP 4-16 replicas, perplexity averaged over all replicas):
  arms, per N replicas, model size and seed, all at equal tokens:
    noloco_H@paper        NoLoCo, H inner steps, outer 0.7/0.5 (noloco momentum rule)
    diloco_2H@paper_hb    DiLoCo, 2H, outer 0.7/0.3 heavy-ball SGD (the NoLoCo paper's baseline)
    diloco_2H@paper_nest  DiLoCo, 2H, outer 0.7/0.9 Nesterov (the DiLoCo paper's default)
    noloco_H@best         NoLoCo at the best point of the grid below
    diloco_2H@best        DiLoCo (heavy-ball) at the best point of the same grid
    diloco_H@paper_hb     DiLoCo at NoLoCo's H (the third arm: equal sync count)
    ddp                   one gradient all-reduce per step (one replica with the global batch)
  1. one equal outer lr x momentum grid per method (NoLoCo's rule, DiLoCo's heavy-ball), seed 0,
     at one (N, model size), chosen on the *validation* split (all-replica mean loss);
  2. every arm on every (N, size) with S seeds; final losses on the *test* split: the mean
     over ALL replicas' models and the loss of the replicas' averaged model;
  3. communication: bytes each node uploads and seconds of sync on the emulated WAN from
     the alpha-beta fit in results/comm_sync.json (pair swap for NoLoCo, ring all-reduce
     for DiLoCo, a gradient all-reduce per step for DDP); curves of the all-replica val
     loss against tokens, MB and WAN seconds; per seed, the WAN seconds NoLoCo (H) needs
     to reach DiLoCo (2H)'s final val loss, paired against DiLoCo's own.

Why in-process replicas: on 2 shared cores one `recipes.train` launch costs ~60 s of
start-up before its first step. Each run is the library's own training (`Trainer` and the
algorithm's hooks, the recipe's model, corpus, sampler, AdamW, clip and schedule) with N
replicas as threads of one process over `core/inprocess.py`
(`algorithms/common/inprocess_replicas.py`); tests/integration/test_transports_agree.py
checks that this gives bit-identical weights to a multi-process gloo run. The curves are the
Trainer's own evaluation, logged by every replica (`logger.all_ranks`).

    python -m benchmarks.noloco_convergence                      # the protocol at this file's defaults
    python -m benchmarks.noloco_convergence --workers 4 --sizes xs --rounds 3 --lrs 0.7 --momentums 0.5 --seeds 1 --allow-dirty  # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Harness, fmt, header, mean_std, seeds_arg
from benchmarks.results_io import RESULTS

# model sizes (tiny: 2 shared CPU cores); the NoLoCo paper trains 125M-6.8B Llamas
SIZES = {"xs": {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 88},
         "s": {"hidden": 64, "layers": 2, "heads": 2, "intermediate": 176}}
# label -> (algorithm, H multiplier, outer optimizer or "best")
ARMS = {
    "ddp": ("ddp", 1, None),
    "noloco_H@paper": ("noloco", 1, {"name": "noloco", "lr": 0.7, "momentum": 0.5, "nesterov": False}),
    "diloco_2H@paper_hb": ("diloco", 2, {"name": "sgd", "lr": 0.7, "momentum": 0.3, "nesterov": False}),
    "diloco_2H@paper_nest": ("diloco", 2, {"name": "sgd", "lr": 0.7, "momentum": 0.9, "nesterov": True}),
    "noloco_H@best": ("noloco", 1, "best"),
    "diloco_2H@best": ("diloco", 2, "best"),
    "diloco_H@paper_hb": ("diloco", 1, {"name": "sgd", "lr": 0.7, "momentum": 0.3, "nesterov": False}),
}
GRID_RULE = {"noloco": {"name": "noloco", "nesterov": False}, "diloco": {"name": "sgd", "nesterov": False}}
_CORPUS: dict[tuple, Any] = {}


# -- one run ----------------------------------------------------------------------------
def _train_config(job: dict[str, Any]):
    """The recipe's TrainConfig for one benchmark run (validated as a recipe run is)."""
    from decentrain.config import config_from_dict

    algo, n = job["algorithm"], job["workers"]
    algorithm: dict[str, Any] = {"name": algo}
    if algo != "ddp":
        algorithm |= {"inner_steps": job["inner_steps"], "outer_optimizer": job["outer_optimizer"]}
    if algo == "noloco":
        algorithm["pairing_seed"] = job["pairing_seed"]
    steps = job["steps"]
    micro = job["local_batch"] * (n if algo == "ddp" else 1)  # DDP: one replica with the whole global batch
    return config_from_dict({
        "algorithm": algorithm,
        "model": {"name": "llama_bench", "hidden_size": job["hidden"], "num_layers": job["layers"], "num_heads": job["heads"],
                  "intermediate_size": job["intermediate"], "max_seq_len": job["seq_len"]},
        "data": {"seq_len": job["seq_len"], "max_bytes_per_domain": job["max_bytes"]},
        "optim": {"lr": job["inner_lr"], "warmup_steps": job["warmup"]},
        "train": {"steps": steps, "global_batch_size": n * job["local_batch"], "micro_batch_size": micro,
                  "eval_every": job["eval_every"], "eval_batches": max(1, job["eval_blocks"] // micro),
                  "checkpoint_every": steps, "keep_checkpoints": 1, "threads": 1, "seed": job["seed"], "device": "cpu",
                  "compile": "none"},
        "logger": {"progress": False, "console": False, "log_every": steps, "all_ranks": True},
        "launcher": {"name": "torchrun", "nproc_per_node": None},
    })


def _corpus(cfg):
    from decentrain.data.blocks import build_corpus
    from decentrain.models.factory import build_tokenizer

    key = (cfg.data.seq_len, cfg.data.max_bytes_per_domain)
    if key not in _CORPUS:
        _CORPUS[key] = build_corpus(cfg.data, build_tokenizer(cfg.model))
    return _CORPUS[key]


def _loss(model, corpus, split: str, n: int) -> float:
    from decentrain.algorithms.common.trainer import evaluate

    blocks = {d: corpus.split(split, d)[:n] for d in corpus.blocks}
    return float(sum(evaluate(model, blocks, 8, torch.device("cpu")).values()) / len(blocks))


def average_state(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The replicas' averaged model (floating tensors averaged, others taken from the first)."""
    return {k: (sum(s[k].double() for s in states) / len(states)).to(v.dtype) if v.is_floating_point() else v
            for k, v in states[0].items()}


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """The all-replica mean of per-replica val curves (same eval steps on every replica)."""
    return [{"step": pts[0]["step"], "val_loss": sum(p["val_loss"] for p in pts) / len(pts)} for pts in zip(*curves)]


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One run of the library's own training: `Trainer` + the algorithm's hooks, N replicas as threads
    over the in-process transport (1 replica with the whole global batch for DDP)."""
    import tempfile

    from decentrain.algorithms.common.inprocess_replicas import run_replicas_in_process
    from decentrain.core.metrics import read_jsonl
    from decentrain.models.factory import build_model, build_tokenizer, num_params

    torch.set_num_threads(1)
    cfg = _train_config(job)
    replicas = 1 if job["algorithm"] == "ddp" else job["workers"]
    with tempfile.TemporaryDirectory(prefix="noloco_convergence_") as run_dir:
        t0 = time.perf_counter()
        runs = run_replicas_in_process(cfg, replicas, Path(run_dir))
        train_s = time.perf_counter() - t0
        curves = []
        for r in range(replicas):
            rows = read_jsonl(Path(run_dir) / ("metrics.jsonl" if r == 0 else f"metrics.rank{r}.jsonl"))
            curves.append([{"step": x["step"], "val_loss": x["eval/loss"]} for x in rows if "eval/loss" in x])
    model = build_model(cfg.model, build_tokenizer(cfg.model))
    corpus, n = _corpus(cfg), job["final_blocks"]
    per = {"val": [], "test": []}
    for r in runs:
        model.load_state_dict(r.weights)
        for split in per:
            per[split].append(_loss(model, corpus, split, n))
    model.load_state_dict(average_state([r.weights for r in runs]))
    avg = {split: _loss(model, corpus, split, n) for split in per}
    return {
        "val_curve": mean_curve(curves),  # all replicas' mean
        "val_curve_rank0": curves[0],
        "final_val_loss": sum(per["val"]) / len(runs), "final_test_loss": sum(per["test"]) / len(runs),
        "final_test_loss_rank0": per["test"][0],
        "final_val_loss_avg_model": avg["val"], "final_test_loss_avg_model": avg["test"],
        "test_loss_replica_spread": max(per["test"]) - min(per["test"]),
        "params": num_params(model), "train_s": train_s,
    }


# -- communication model ----------------------------------------------------------------
def comm_per_step(algo: str, n: int, h: int, params: int, fits: dict) -> tuple[float, float]:
    """(bytes each node uploads, emulated-WAN seconds) per inner step, fp32 weights."""
    from benchmarks.comm_sync import wire

    nbytes = 4 * params
    method, every = {"noloco": ("pair", h), "diloco": ("ring", h), "ddp": ("ring", 1)}[algo]
    messages, sent = wire(method, n, nbytes)
    fit = fits[f"emulated/{method}"]
    return sent / every, (fit["alpha_s"] * messages + sent / fit["beta_bytes_per_s"]) / every


def first_step_at(curve: list[dict], target: float) -> float | None:
    """The (linearly interpolated) inner step at which a val curve first reaches `target`."""
    prev = (0, math.inf)
    for p in curve:
        if p["val_loss"] <= target:
            if not math.isfinite(prev[1]):
                return float(p["step"])
            frac = (prev[1] - target) / (prev[1] - p["val_loss"])
            return prev[0] + frac * (p["step"] - prev[0])
        prev = (p["step"], p["val_loss"])
    return None


def wan_to_target(noloco: list[dict], diloco: list[dict], wan_per_step: dict[str, float]) -> dict[str, Any]:
    """Per seed: emulated-WAN sync seconds NoLoCo needs to first reach DiLoCo's final val loss, against DiLoCo's
    own (it reaches it at its last eval); None where NoLoCo never gets there."""
    target = diloco[-1]["val_loss"]
    nstep, dstep = first_step_at(noloco, target), first_step_at(diloco, target)
    n_s = None if nstep is None else nstep * wan_per_step["noloco"]
    d_s = dstep * wan_per_step["diloco"]
    return {"target_val_loss": target, "noloco_step": nstep, "diloco_step": dstep, "noloco_wan_s": n_s, "diloco_wan_s": d_s,
            "ratio": None if n_s is None else n_s / d_s}


# -- protocol ---------------------------------------------------------------------------
def _arm_opt(spec, algo: str, best: dict[str, dict]) -> dict | None:
    return best[algo] if spec == "best" else spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16], help="N replicas")
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--n16-sizes", nargs="+", default=["xs"], help="sizes run at the largest N (compute)")
    ap.add_argument("--inner-steps", type=int, default=4, help="NoLoCo's H (DiLoCo gets 2H); paper 50 vs 100")
    ap.add_argument("--rounds", type=int, default=10, help="DiLoCo (2H) outer rounds; steps = rounds x 2H")
    ap.add_argument("--local-batch", type=int, default=4, help="sequences per replica per step")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--max-bytes", type=int, default=200_000, help="data.max_bytes_per_domain")
    ap.add_argument("--inner-lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--eval-every-rounds", type=int, default=1, help="in DiLoCo (2H) rounds")
    ap.add_argument("--eval-blocks", type=int, default=8, help="val blocks per domain for the curves")
    ap.add_argument("--final-blocks", type=int, default=32, help="val/test blocks per domain for the final losses")
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.7, 1.0])
    ap.add_argument("--momentums", type=float, nargs="+", default=[0.3, 0.5])
    ap.add_argument("--grid-at", default="4:xs", help="N:size where the grid is chosen (seed 0, val)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (processes)")
    seeds_arg(ap)
    args = ap.parse_args()
    h = args.inner_steps
    steps = args.rounds * 2 * h
    base = {"steps": steps, "local_batch": args.local_batch, "seq_len": args.seq_len, "max_bytes": args.max_bytes,
            "inner_lr": args.inner_lr, "warmup": args.warmup, "eval_every": args.eval_every_rounds * 2 * h,
            "eval_blocks": args.eval_blocks, "final_blocks": args.final_blocks, "pairing_seed": 0}
    fits = json.loads((RESULTS / "comm_sync.json").read_text())["figures"]["fits"]
    big_n = max(args.workers)
    cells = [(n, s) for n in args.workers for s in args.sizes if n != big_n or s in args.n16_sizes or len(args.workers) == 1]
    grid_n, grid_size = args.grid_at.split(":")
    grid_n = int(grid_n) if int(grid_n) in args.workers else args.workers[0]
    grid_size = grid_size if grid_size in args.sizes else args.sizes[0]
    config = {"protocol": {**base, "noloco_H": h, "diloco_2H": 2 * h, "rounds_2H": args.rounds}, "sizes": {s: SIZES[s] for s in args.sizes},
              "cells": [f"N={n}:{s}" for n, s in cells], "arms": {k: [a, m, o] for k, (a, m, o) in ARMS.items()},
              "grid": {"outer_lr": args.lrs, "outer_momentum": args.momentums, "rules": GRID_RULE, "at": f"N={grid_n}:{grid_size}"},
              "seeds": list(range(args.seeds)),
              "selection": "final val loss, mean over all replicas, seed 0, at grid.at",
              "comm_fits": {k: fits[k] for k in ("emulated/pair", "emulated/ring")}, "emulation": "in-process replicas"}
    hz = Harness("noloco_convergence", __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh)

    def job(algo, mult, opt, n, size, seed=0):
        j = {**base, **SIZES[size], "workers": n, "algorithm": algo, "seed": seed}
        return j if algo == "ddp" else {**j, "inner_steps": mult * h, "outer_optimizer": opt}

    # 1. one equal grid per method (NoLoCo at H, DiLoCo heavy-ball at 2H), seed 0, chosen on val
    grid_jobs = [job(a, m, {**GRID_RULE[a], "lr": lr, "momentum": mom}, grid_n, grid_size)
                 for a, m in (("noloco", 1), ("diloco", 2)) for lr in args.lrs for mom in args.momentums]
    grid_res = hz.run_jobs(grid_jobs, train_run, desc="grid (val)", parallel=args.parallel)
    grid = {a: [] for a in ("noloco", "diloco")}
    for j, r in zip(grid_jobs, grid_res):
        grid[j["algorithm"]].append({"outer_lr": j["outer_optimizer"]["lr"], "outer_momentum": j["outer_optimizer"]["momentum"],
                                     "final_val_loss": r["final_val_loss"], "diverged": not math.isfinite(r["final_val_loss"])})
    best_row = {a: min((g for g in rows if not g["diverged"]), key=lambda g: g["final_val_loss"]) for a, rows in grid.items()}
    best = {a: {**GRID_RULE[a], "lr": b["outer_lr"], "momentum": b["outer_momentum"]} for a, b in best_row.items()}

    # 2. every arm on every (N, size), S seeds; ordered seed-major so that a cut-short run has whole seeds
    test_jobs = {(n, s, label, seed): job(a, m, _arm_opt(o, a, best), n, s, seed)
                 for seed in range(args.seeds) for n, s in cells for label, (a, m, o) in ARMS.items()}
    flat_res = hz.run_jobs(list(test_jobs.values()), train_run, desc="arms (test)", parallel=args.parallel)
    res = dict(zip(test_jobs, flat_res))
    figures: dict[str, Any] = {"grid": grid, "best": best, "cells": {}, "steps": steps}
    for n, s in cells:
        params = res[(n, s, "ddp", 0)]["params"]
        tokens_per_step = n * args.local_batch * args.seq_len
        arms = {}
        for label, (a, m, _) in ARMS.items():
            rs = [res[(n, s, label, seed)] for seed in range(args.seeds)]
            bps, wps = comm_per_step(a, n, m * h, params, fits)
            arms[label] = {
                "algorithm": a, "H": None if a == "ddp" else m * h, "outer_optimizer": test_jobs[(n, s, label, 0)].get("outer_optimizer"),
                **{k: mean_std([r[k] for r in rs]) for k in ("final_test_loss", "final_val_loss", "final_test_loss_avg_model",
                                                             "final_test_loss_rank0", "test_loss_replica_spread", "train_s")},
                "bytes_per_step": bps, "wan_s_per_step": wps, "mb_sent_per_node": bps * steps / 1e6, "wan_sync_s": wps * steps,
                "val_curve_mean": mean_curve([r["val_curve"] for r in rs]),
                "val_curves": [r["val_curve"] for r in rs],
            }

        def paired(x: str, y: str, key: str = "final_test_loss") -> dict[str, Any]:
            """Per-seed x - y (absolute loss), paired on the seed."""
            return mean_std([a - b for a, b in zip(arms[x][key]["values"], arms[y][key]["values"])])

        comps = {
            "paper_defaults_vs_hb": ("noloco_H@paper", "diloco_2H@paper_hb"),
            "paper_defaults_vs_nesterov": ("noloco_H@paper", "diloco_2H@paper_nest"),
            "best_vs_best": ("noloco_H@best", "diloco_2H@best"),
            "noloco_H_vs_diloco_H": ("noloco_H@paper", "diloco_H@paper_hb"),
        }
        comparisons = {}
        for name, (x, y) in comps.items():
            wan = [wan_to_target(cx, cy, {"noloco": arms[x]["wan_s_per_step"], "diloco": arms[y]["wan_s_per_step"]})
                   for cx, cy in zip(arms[x]["val_curves"], arms[y]["val_curves"])]
            ratios = [w["ratio"] for w in wan]
            comparisons[name] = {
                "noloco": x, "diloco": y,
                "delta_test_loss": paired(x, y), "delta_test_loss_avg_model": paired(x, y, "final_test_loss_avg_model"),
                "wan_to_diloco_final": wan, "seeds_reached": sum(r is not None for r in ratios),
                "wan_ratio": mean_std([r for r in ratios if r is not None]) if any(r is not None for r in ratios) else None,
                "wan_delta_s": (mean_std([w["noloco_wan_s"] - w["diloco_wan_s"] for w in wan])
                                if all(r is not None for r in ratios) else None),
            }
        main_c = comparisons["paper_defaults_vs_hb"]
        figures["cells"][f"N={n}:{s}"] = {
            "workers": n, "size": s, "params": params, "tokens": steps * tokens_per_step, "tokens_per_step": tokens_per_step,
            "arms": arms, "comparisons": comparisons,
            "loss_target_met": main_c["delta_test_loss"]["mean"] <= 0,
            "wan_target_met": (main_c["seeds_reached"] == args.seeds and main_c["wan_ratio"]["mean"] <= 0.5),
        }
    key16 = [k for k, c in figures["cells"].items() if c["workers"] == big_n]
    figures["target"] = (f"at N={big_n}: NoLoCo (H) mean final test loss (all replicas) <= DiLoCo (2H, paper heavy-ball) and "
                         "reaches DiLoCo's final val loss in <= 0.5x its emulated-WAN sync seconds (mean over seeds, paired)")
    figures["target_met"] = bool(key16) and all(figures["cells"][k]["loss_target_met"] and figures["cells"][k]["wan_target_met"]
                                                for k in key16)
    figures["departures"] = [
        f"model: {', '.join(f'{s} {SIZES[s]}' for s in args.sizes)} Llama (~10^4-10^5 params) vs the paper's 125M-6.8B",
        f"H: NoLoCo H={h} vs DiLoCo 2H={2 * h} (paper 50 vs 100); {steps} inner steps, {args.rounds} DiLoCo rounds (paper: thousands)",
        f"data: the library's small built-in corpus, {args.max_bytes} bytes per domain, seq {args.seq_len} (paper: web text, seq 1024+)",
        f"grid chosen once at {config['grid']['at']}, seed 0, applied to every (N, size); {len(args.lrs)}x{len(args.momentums)} points",
        f"N={big_n} on sizes {args.n16_sizes} only" if len(args.workers) > 1 else "one N",
        "DDP: one replica with the global batch (same tokens/step), ring all-reduce of fp32 gradients every step",
        "WAN seconds: sync only (alpha-beta fit of comm_sync's emulated link), compute excluded (equal per step across arms)",
        "curves: val subset (eval_blocks per domain), all-replica mean; final losses on val/test subsets (final_blocks per domain)",
        "in-process replicas (threads) instead of processes; no pipeline parallelism or random routing",
    ]
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


# -- JSON -> TXT / PNG ------------------------------------------------------------------
def _opt(o: dict | None) -> str:
    return "" if o is None else f"{o['name']}{'+nest' if o.get('nesterov') else ''} {o['lr']:g}/{o['momentum']:g}"


def text(rec: dict) -> str:
    f, p = rec["figures"], rec["config"]["protocol"]
    lines = [header(rec), "",
             f"NoLoCo H={p['noloco_H']} vs DiLoCo 2H={p['diloco_2H']}, {f['steps']} inner steps ({p['rounds_2H']} DiLoCo rounds) at "
             f"equal tokens; cells {', '.join(rec['config']['cells'])}; seeds {rec['config']['seeds']}; {rec['config']['emulation']}",
             f"grid at {rec['config']['grid']['at']} (seed 0, all-replica val loss), same for both methods:"]
    for a, rows in f["grid"].items():
        moms = sorted({r["outer_momentum"] for r in rows})
        lines.append(f"  {a:7s} lr\\mom " + " ".join(f"{m:>7g}" for m in moms))
        for lr in sorted({r["outer_lr"] for r in rows}):
            vals = {r["outer_momentum"]: r["final_val_loss"] for r in rows if r["outer_lr"] == lr}
            lines.append(f"          {lr:<6g} " + " ".join(f"{vals[m]:7.4f}" for m in moms))
        lines.append(f"          best: {_opt(f['best'][a])}")
    for key, c in f["cells"].items():
        lines += ["", f"== {key}: {c['params'] / 1e3:.0f}k params, {c['tokens'] / 1e6:.2f}M tokens ==",
                  f"{'arm':22s} {'outer':>18s} {'test loss, all replicas':>24s} {'avg model':>17s} {'rank 0':>8s} "
                  f"{'MB/node':>8s} {'WAN s':>7s}"]
        for label, r in c["arms"].items():
            lines.append(f"{label:22s} {_opt(r['outer_optimizer']):>18s} {fmt(r['final_test_loss']):>24s} "
                         f"{fmt(r['final_test_loss_avg_model']):>17s} {r['final_test_loss_rank0']['mean']:8.4f} "
                         f"{r['mb_sent_per_node']:8.1f} {r['wan_sync_s']:7.1f}")
        lines.append("paired per seed (NoLoCo - DiLoCo, test loss; WAN s to DiLoCo's final val loss):")
        for name, x in c["comparisons"].items():
            ratio = fmt(x["wan_ratio"], 2) + "x" if x["wan_ratio"] else "never"
            dwan = fmt(x["wan_delta_s"], 1) + " s" if x["wan_delta_s"] else "-"
            lines.append(f"  {name:28s} Δloss {fmt(x['delta_test_loss'])}  Δavg-model {fmt(x['delta_test_loss_avg_model'])}  "
                         f"WAN ratio {ratio} (reached {x['seeds_reached']}/{len(x['wan_to_diloco_final'])}), ΔWAN {dwan}")
        lines.append(f"  targets: loss {'MET' if c['loss_target_met'] else 'not met'}, ≤0.5x WAN {'MET' if c['wan_target_met'] else 'not met'}")
    lines += ["", "trend (paper defaults, NoLoCo H - DiLoCo 2H heavy-ball, test loss; WAN ratio):"]
    for key, c in f["cells"].items():
        x = c["comparisons"]["paper_defaults_vs_hb"]
        lines.append(f"  {key:10s} Δ {fmt(x['delta_test_loss'])}  WAN ratio "
                     + (fmt(x["wan_ratio"], 2) if x["wan_ratio"] else "never") + f" ({x['seeds_reached']} seeds reached)")
    lines += ["", f"target: {f['target']}: {'MET' if f['target_met'] else 'NOT MET'}", "departures from the paper's protocol:"]
    lines += [f"  - {d}" for d in f["departures"]]
    lines.append("train s in the JSON: measured on a shared 2-core machine under load, for orientation only")
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    cells = list(f["cells"])
    fig, axes = plt.subplots(len(cells), 3, figsize=(16, 3.6 * len(cells)), squeeze=False)
    for row, key in enumerate(cells):
        c = f["cells"][key]
        for label, r in c["arms"].items():
            cur = r["val_curve_mean"]
            ys = [p["val_loss"] for p in cur]
            for ax, per in ((axes[row][0], c["tokens_per_step"] / 1e6), (axes[row][1], r["bytes_per_step"] / 1e6),
                            (axes[row][2], r["wan_s_per_step"])):
                ax.plot([p["step"] * per for p in cur], ys, "--" if label.startswith("diloco") else "-", marker=".", ms=3, label=label)
        axes[row][0].set(xlabel="tokens (M)", ylabel=f"{key}\nval loss (all replicas, seed mean)")
        axes[row][1].set(xlabel="MB uploaded per node", xscale="symlog")
        axes[row][2].set(xlabel="emulated-WAN sync s (comm_sync fit)", xscale="symlog")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{rec['name']} @ {rec['git_sha'][:10]}: NoLoCo H vs DiLoCo 2H; target {'met' if f['target_met'] else 'NOT met'}")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
