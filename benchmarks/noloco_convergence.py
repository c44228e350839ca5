"""noloco_convergence: NoLoCo vs DiLoCo with an equal tuning budget, DDP as the reference.

Protocol (the same for both methods):
  1. sweep outer lr x outer momentum on one grid, seed 0, and choose each method's best
     setting on the *validation* split (final loss, rank 0's replica);
  2. run the chosen settings on the *test* split with S seeds (DDP too), and report
     best-vs-best, same-hyperparameters (both methods at NoLoCo's best, and at DiLoCo's
     best) and the papers' defaults (NoLoCo 0.7/0.5, DiLoCo 0.7/0.9 Nesterov) side by
     side, mean ± std of the per-seed paired differences;
  3. charge communication: bytes each node uploads, and seconds of sync on the emulated
     WAN from the alpha-beta fit in results/comm_sync.json (pair swap for NoLoCo, ring
     all-reduce for DiLoCo, one gradient all-reduce per step for DDP), and the MB and
     WAN seconds each method needs to first reach a common val loss (seed-mean curves).

Why in-process replicas: on 2 shared cores one `recipes.train` launch costs ~60 s of
start-up before its first step, which would take the ~50 runs of an equal tuning budget to
hours. Each run is the library's own training (`Trainer` and the algorithm's hooks, the
recipe's model, corpus, sampler, AdamW, clip and schedule) with N replicas as threads of
one process talking over `core/inprocess.py` instead of torch.distributed
(`algorithms/common/inprocess_replicas.py`). tests/integration/test_transports_agree.py
checks that NoLoCo and DiLoCo give bit-identical weights that way and in a multi-process
gloo run of `run_pretraining`. Evaluation during the run (the curve) is the Trainer's own
(`train.eval_batches` micro-batches per domain of the val split, rank 0's replica).

    python -m benchmarks.noloco_convergence                      # full protocol (4x4 grid x 2 methods, 3 seeds)
    python -m benchmarks.noloco_convergence --rounds 10 --lrs 0.7 --momentums 0.5 --seeds 1 --allow-dirty  # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Harness, fmt, header, mean_std, seeds_arg
from benchmarks.results_io import RESULTS

PAPER_DEFAULTS = {"noloco": (0.7, 0.5), "diloco": (0.7, 0.9)}  # NoLoCo paper; DiLoCo paper (Nesterov)
_CORPUS: dict[tuple, Any] = {}


# -- one run ----------------------------------------------------------------------------
def _configs(job: dict[str, Any]):
    from decentrain.config import OptimConfig
    from decentrain.data.blocks import DataConfig
    from decentrain.models.factory import ModelConfig

    model = ModelConfig(name="llama_bench", hidden_size=job["hidden"], num_layers=job["layers"], num_heads=job["heads"],
                        intermediate_size=job["intermediate"], max_seq_len=job["seq_len"])
    data = DataConfig(seq_len=job["seq_len"], max_bytes_per_domain=job["max_bytes"])
    optim = OptimConfig(lr=job["inner_lr"], warmup_steps=job["warmup"])
    return model, data, optim


def _corpus(data_cfg, tokenizer):
    key = (data_cfg.seq_len, data_cfg.max_bytes_per_domain)
    if key not in _CORPUS:
        from decentrain.data.blocks import build_corpus

        _CORPUS[key] = build_corpus(data_cfg, tokenizer)
    return _CORPUS[key]


def _mean_loss(model, corpus, split: str, n: int | None, micro: int) -> float:
    from decentrain.algorithms.common.trainer import evaluate

    blocks = {d: corpus.split(split, d)[:n] for d in corpus.blocks}
    return float(sum(evaluate(model, blocks, micro, torch.device("cpu")).values()) / len(blocks))


def _train_config(job: dict[str, Any]):
    """The recipe's TrainConfig for one benchmark run (validated as a recipe run is)."""
    from decentrain.config import config_from_dict

    algo, n = job["algorithm"], job["workers"]
    algorithm: dict[str, Any] = {"name": algo}
    if algo == "diloco":
        algorithm |= {"inner_steps": job["inner_steps"], "outer_lr": job["outer_lr"],
                      "outer_momentum": job["outer_momentum"], "nesterov": job["outer_momentum"] > 0}
    elif algo == "noloco":
        algorithm |= {"inner_steps": job["inner_steps"], "outer_lr": job["outer_lr"],
                      "outer_momentum": job["outer_momentum"], "pairing_seed": job["pairing_seed"]}
    steps = job["rounds"] * job["inner_steps"]
    micro = job["local_batch"] * (n if algo == "ddp" else 1)  # DDP: one replica with the whole global batch
    return config_from_dict({
        "algorithm": algorithm,
        "model": {"name": "llama_bench", "hidden_size": job["hidden"], "num_layers": job["layers"], "num_heads": job["heads"],
                  "intermediate_size": job["intermediate"], "max_seq_len": job["seq_len"]},
        "data": {"seq_len": job["seq_len"], "max_bytes_per_domain": job["max_bytes"]},
        "optim": {"lr": job["inner_lr"], "warmup_steps": job["warmup"]},
        "train": {"steps": steps, "global_batch_size": n * job["local_batch"], "micro_batch_size": micro,
                  "eval_every": job["eval_every_rounds"] * job["inner_steps"],
                  "eval_batches": max(1, job["eval_blocks"] // micro), "checkpoint_every": steps, "keep_checkpoints": 1,
                  "threads": 1, "seed": job["seed"], "device": "cpu", "compile": "none"},
        "logger": {"progress": False, "log_every": steps},
        "launcher": {"name": "torchrun", "nproc_per_node": None},
    })


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
        rows = read_jsonl(Path(run_dir) / "metrics.jsonl")  # rank 0's replica
    curve = [{"step": r["step"], "val_loss": r["eval/loss"]} for r in rows if "eval/loss" in r]
    tok = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tok)
    model.load_state_dict(runs[0].weights)
    corpus = _corpus(cfg.data, tok)
    return {
        "val_curve": curve,
        "final_val_loss": _mean_loss(model, corpus, "val", None, 8),  # rank 0's replica, whole val split
        "final_test_loss": _mean_loss(model, corpus, "test", None, 8),
        "params": num_params(model),
        "train_s": train_s,
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


def comm_to_loss(noloco: dict, diloco: dict, steps: int) -> dict[str, Any]:
    """MB uploaded and emulated-WAN sync seconds each method spends to first reach a val loss both reach
    (the worse of the two seed-mean final curve values): loss per byte / per second of sync, as one number each."""
    target = max(noloco["val_curve_mean"][-1]["val_loss"], diloco["val_curve_mean"][-1]["val_loss"])
    out: dict[str, Any] = {"val_loss": target}
    for name, r in (("noloco", noloco), ("diloco", diloco)):
        step = first_step_at(r["val_curve_mean"], target)
        out[name] = {"step": step, "mb": r["bytes_sent_per_node"] / steps * step / 1e6, "wan_s": r["emulated_wan_sync_s"] / steps * step}
    out["noloco_over_diloco"] = {k: out["noloco"][k] / out["diloco"][k] for k in ("mb", "wan_s")}
    return out


# -- protocol ---------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=100, help="outer rounds (steps = rounds x H)")
    ap.add_argument("--inner-steps", type=int, default=2, help="H (small, to afford 100 rounds on 2 cores)")
    ap.add_argument("--local-batch", type=int, default=4, help="sequences per replica per step")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=176)
    ap.add_argument("--max-bytes", type=int, default=200_000, help="data.max_bytes_per_domain")
    ap.add_argument("--inner-lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--eval-every-rounds", type=int, default=10)
    ap.add_argument("--eval-blocks", type=int, default=16, help="val blocks per domain for the curve (final evals use whole splits)")
    # the grid, the same for both methods (both paper defaults lie on it)
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.3, 0.5, 0.7, 1.0])
    ap.add_argument("--momentums", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.9])
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (processes)")
    seeds_arg(ap)
    args = ap.parse_args()
    base = {"workers": args.workers, "rounds": args.rounds, "inner_steps": args.inner_steps, "local_batch": args.local_batch,
            "seq_len": args.seq_len, "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
            "intermediate": args.intermediate, "max_bytes": args.max_bytes, "inner_lr": args.inner_lr, "warmup": args.warmup,
            "eval_every_rounds": args.eval_every_rounds, "eval_blocks": args.eval_blocks, "pairing_seed": 0}
    model_cfg, data_cfg, optim_cfg = _configs(base)
    fits = json.loads((RESULTS / "comm_sync.json").read_text())["figures"]["fits"]
    config = {"protocol": base, "grid": {"outer_lr": args.lrs, "outer_momentum": args.momentums}, "seeds": list(range(args.seeds)),
              "selection": "final val loss (rank 0 replica, whole val split), seed 0", "paper_defaults": PAPER_DEFAULTS,
              "resolved": {"model": asdict(model_cfg), "data": asdict(data_cfg), "optim": asdict(optim_cfg)},
              "comm_fits": {k: fits[k] for k in ("emulated/pair", "emulated/ring")}, "emulation": "in-process replicas"}
    hz = Harness("noloco_convergence", __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh)

    def job(algo, lr=None, mom=None, seed=0):
        j = {**base, "algorithm": algo, "seed": seed}
        return j if algo == "ddp" else {**j, "outer_lr": lr, "outer_momentum": mom}

    # 1. the sweep, the same grid for both methods, chosen on val
    grid_jobs = [job(a, lr, mom) for a in ("noloco", "diloco") for lr in args.lrs for mom in args.momentums]
    grid_res = hz.run_jobs(grid_jobs, train_run, desc="grid (val)", parallel=args.parallel)
    grid = {a: [] for a in ("noloco", "diloco")}
    for j, r in zip(grid_jobs, grid_res):
        grid[j["algorithm"]].append({"outer_lr": j["outer_lr"], "outer_momentum": j["outer_momentum"],
                                     "final_val_loss": r["final_val_loss"], "diverged": not math.isfinite(r["final_val_loss"])})
    best = {a: min((g for g in rows if not g["diverged"]), key=lambda g: g["final_val_loss"]) for a, rows in grid.items()}
    best_hp = {a: (b["outer_lr"], b["outer_momentum"]) for a, b in best.items()}

    # 2. the chosen settings on test, S seeds
    settings = {  # label -> (algorithm, lr, momentum)
        "ddp": ("ddp", None, None),
        "noloco@best_noloco": ("noloco", *best_hp["noloco"]), "diloco@best_diloco": ("diloco", *best_hp["diloco"]),
        "noloco@paper": ("noloco", *PAPER_DEFAULTS["noloco"]), "diloco@paper": ("diloco", *PAPER_DEFAULTS["diloco"]),
        # same hyperparameters: each method at the other's best (seed 0 of every grid point is already cached)
        "noloco@best_diloco": ("noloco", *best_hp["diloco"]), "diloco@best_noloco": ("diloco", *best_hp["noloco"]),
    }
    test_jobs = {label: [job(a, lr, mom, s) for s in range(args.seeds)] for label, (a, lr, mom) in settings.items()}
    flat = [j for js in test_jobs.values() for j in js]
    flat_res = hz.run_jobs(flat, train_run, desc="test seeds", parallel=args.parallel)
    res = {json.dumps(j, sort_keys=True): r for j, r in zip(flat, flat_res)}
    params = flat_res[0]["params"]
    steps = args.rounds * args.inner_steps
    tokens = steps * args.workers * args.local_batch * args.seq_len
    runs = {}
    for label, js in test_jobs.items():
        rs = [res[json.dumps(j, sort_keys=True)] for j in js]
        a, lr, mom = settings[label]
        per_step_bytes, per_step_s = comm_per_step(a, args.workers, args.inner_steps, params, fits)
        runs[label] = {
            "algorithm": a, "outer_lr": lr, "outer_momentum": mom,
            "test_loss": mean_std([r["final_test_loss"] for r in rs]),
            "val_loss": mean_std([r["final_val_loss"] for r in rs]),
            "train_s": mean_std([r["train_s"] for r in rs]),
            "bytes_sent_per_node": per_step_bytes * steps, "emulated_wan_sync_s": per_step_s * steps,
            "val_curve_seed0": rs[0]["val_curve"],
            "val_curve_mean": [{"step": pts[0]["step"], "val_loss": sum(p["val_loss"] for p in pts) / len(pts)}
                               for pts in zip(*(r["val_curve"] for r in rs))],
        }

    def paired(x: str, y: str) -> dict[str, Any]:
        """Per-seed (x/y − 1) in %, paired on the seed."""
        xs, ys = runs[x]["test_loss"]["values"], runs[y]["test_loss"]["values"]
        return mean_std([100 * (a / b - 1) for a, b in zip(xs, ys)])

    comparisons = {
        "best_vs_best": {"noloco": "noloco@best_noloco", "diloco": "diloco@best_diloco"},
        "paper_defaults": {"noloco": "noloco@paper", "diloco": "diloco@paper"},
        "same_hp_at_best_noloco": {"noloco": "noloco@best_noloco", "diloco": "diloco@best_noloco"},
        "same_hp_at_best_diloco": {"noloco": "noloco@best_diloco", "diloco": "diloco@best_diloco"},
    }
    for c in comparisons.values():
        c["noloco_vs_diloco_pct"] = paired(c["noloco"], c["diloco"])
    # same hyperparameters: every grid point, seed 0, val split (S-seed test runs of the crossed settings did not fit)
    val = {(a, r["outer_lr"], r["outer_momentum"]): r["final_val_loss"] for a, rows in grid.items() for r in rows}
    same_hp = [{"outer_lr": lr, "outer_momentum": m, "noloco_vs_diloco_pct": 100 * (val["noloco", lr, m] / val["diloco", lr, m] - 1)}
               for (a, lr, m) in val if a == "noloco"]
    bb = runs["noloco@best_noloco"]["test_loss"]["mean"], runs["diloco@best_diloco"]["test_loss"]["mean"]
    figures = {
        "params": params, "steps": steps, "tokens": tokens, "grid": grid, "best": best_hp, "runs": runs,
        "comparisons": comparisons, "same_hp_val_seed0": same_hp,
        "comm_to_common_loss": comm_to_loss(runs["noloco@best_noloco"], runs["diloco@best_diloco"], steps),
        "vs_ddp_pct": {k: paired(k, "ddp") for k in runs if k != "ddp"},
        "target": "NoLoCo final test loss <= best-tuned DiLoCo's at equal tokens (best vs best, mean over seeds)",
        "target_met": bool(bb[0] <= bb[1]),
    }
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


# -- JSON -> TXT / PNG ------------------------------------------------------------------
def text(rec: dict) -> str:
    f, p = rec["figures"], rec["config"]["protocol"]
    lines = [header(rec), "",
             f"{p['workers']} replicas, {f['params'] / 1e3:.0f}k-param Llama, H={p['inner_steps']}, {p['rounds']} outer rounds "
             f"= {f['steps']} steps, {f['tokens'] / 1e6:.2f}M tokens; {rec['config']['emulation']}; test over seeds "
             f"{rec['config']['seeds']}", "",
             "grid (seed 0, final val loss; same grid for both methods):"]
    for a, rows in f["grid"].items():
        moms = sorted({r["outer_momentum"] for r in rows})
        lines.append(f"  {a:7s} lr\\mom " + " ".join(f"{m:>7g}" for m in moms))
        for lr in sorted({r["outer_lr"] for r in rows}):
            vals = {r["outer_momentum"]: r["final_val_loss"] for r in rows if r["outer_lr"] == lr}
            lines.append(f"          {lr:<6g} " + " ".join(f"{vals[m]:7.4f}" for m in moms))
        lines.append(f"          best: lr {f['best'][a][0]:g}, momentum {f['best'][a][1]:g}")
    lines += ["", f"{'setting':30s} {'test loss (mean ± std)':>24s} {'vs DDP %':>16s} {'MB sent/node':>12s} {'WAN sync s':>10s} {'train s':>8s}"]
    for label, r in f["runs"].items():
        vs = f["vs_ddp_pct"].get(label)
        hp = "" if r["outer_lr"] is None else f" ({r['outer_lr']:g}/{r['outer_momentum']:g})"
        lines.append(f"{label + hp:30.30s} {fmt(r['test_loss']):>24s} {(fmt(vs, 2) if vs else '-'):>16s} "
                     f"{r['bytes_sent_per_node'] / 1e6:12.1f} {r['emulated_wan_sync_s']:10.1f} {r['train_s']['mean']:8.0f}")
    lines += ["", "NoLoCo vs DiLoCo, test loss, per-seed paired (NoLoCo/DiLoCo - 1):"]
    for name, c in f["comparisons"].items():
        lines.append(f"  {name:24s} {c['noloco']:>20s} vs {c['diloco']:<20s} {fmt(c['noloco_vs_diloco_pct'], 2)} %")
    lines.append("  same hyperparameters (grid, seed 0, val): "
                 + ", ".join(f"{r['outer_lr']:g}/{r['outer_momentum']:g}: {r['noloco_vs_diloco_pct']:+.2f}%" for r in f["same_hp_val_seed0"]))
    nb, db = f["runs"]["noloco@best_noloco"], f["runs"]["diloco@best_diloco"]
    c2l = f["comm_to_common_loss"]
    lines += ["", f"loss per communication (best vs best): NoLoCo {nb['test_loss']['mean']:.4f} for {nb['bytes_sent_per_node'] / 1e6:.1f} MB, "
              f"{nb['emulated_wan_sync_s']:.1f} s WAN sync; DiLoCo {db['test_loss']['mean']:.4f} for {db['bytes_sent_per_node'] / 1e6:.1f} MB, "
              f"{db['emulated_wan_sync_s']:.1f} s",
              f"to first reach val loss {c2l['val_loss']:.4f} (seed-mean curves): NoLoCo {c2l['noloco']['mb']:.1f} MB / "
              f"{c2l['noloco']['wan_s']:.1f} s WAN sync (step {c2l['noloco']['step']:.0f}), DiLoCo {c2l['diloco']['mb']:.1f} MB / "
              f"{c2l['diloco']['wan_s']:.1f} s (step {c2l['diloco']['step']:.0f}); NoLoCo/DiLoCo: "
              f"{c2l['noloco_over_diloco']['mb']:.2f}x bytes, {c2l['noloco_over_diloco']['wan_s']:.2f}x WAN seconds",
              f"target: {f['target']}: {'MET' if f['target_met'] else 'NOT MET'} "
              f"(NoLoCo {fmt(nb['test_loss'])} vs DiLoCo {fmt(db['test_loss'])})",
              "train s: measured on a shared 2-core machine under load, for orientation only"]
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    for a, ls in (("noloco", "-"), ("diloco", "--")):
        rows = f["grid"][a]
        for m in sorted({r["outer_momentum"] for r in rows}):
            pts = sorted((r["outer_lr"], r["final_val_loss"]) for r in rows if r["outer_momentum"] == m)
            axes[0].plot([x for x, _ in pts], [y for _, y in pts], ls, marker="o", ms=3, label=f"{a} μ={m:g}")
    axes[0].set(xlabel="outer lr", ylabel="final val loss (seed 0)", title="equal tuning grid")
    axes[0].legend(fontsize=7, ncol=2)
    for label in ("ddp", "noloco@best_noloco", "diloco@best_diloco", "noloco@paper", "diloco@paper"):
        r = f["runs"][label]
        c = r.get("val_curve_mean", r["val_curve_seed0"])
        axes[1].plot([p["step"] for p in c], [p["val_loss"] for p in c], label=label)
        for ax, total in ((axes[2], r["bytes_sent_per_node"] / 1e6), (axes[3], r["emulated_wan_sync_s"])):
            ax.plot([p["step"] * total / f["steps"] for p in c], [p["val_loss"] for p in c], label=label)
    axes[1].set(xlabel="inner step", ylabel="val loss (rank 0, mean over seeds)", title="curves")
    axes[2].set(xlabel="MB uploaded per node", ylabel="val loss", xscale="symlog", title="loss per byte sent")
    axes[3].set(xlabel="emulated-WAN sync s (comm_sync fit)", ylabel="val loss", xscale="symlog", title="loss per second of sync")
    for ax in axes[1:]:
        ax.legend(fontsize=7)
    fig.suptitle(f"{rec['name']} @ {rec['git_sha'][:10]}: target {'met' if f['target_met'] else 'NOT met'}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
