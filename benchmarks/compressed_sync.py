"""compressed_sync: bytes each method sends to reach DiLoCo's best final loss: DiLoCo, SparseLoCo, compressed NoLoCo.

Each run is the library's own training loop (`Trainer` and the algorithm's hooks) with N
replicas as threads over the in-process transport (algorithms/pretraining/inprocess_replicas.py),
a small Llama on the offline corpus, CPU. Methods share everything but `algorithm`: model,
data, seed, inner AdamW, global batch (split over the N replicas), steps.

Protocol (per N):
  1. tuning seed: per method and H, an outer-lr grid on a fixed ladder; a winner on the grid's
     edge extends the grid by the next rung that way (at most `--max-extend` times), so the
     chosen lr is bracketed or the TXT says it is not. Each method's own best H is the H whose
     tuned lr gives the lowest final eval loss; equal H is `--equal-h` for every method.
  2. `--seeds` other seeds for every method at its tuned lr, at equal H and at its best H.
  3. DiLoCo's best final loss = the seed mean of its better H; target = that + 1 %. Per variant:
     bytes one replica sends until its seed-mean eval curve first reaches the target, the ratio
     to DiLoCo's bytes to the same target, final loss mean ± std, and the paired (same seed)
     final-loss difference to DiLoCo-best with a paired t-test, its 95 % interval, and the
     smallest difference the run can detect (80 % power, two-sided 5 %).

Bytes per replica and sync, two ways: payload (what one replica contributes: SparseLoCo's and
compressed NoLoCo's logged `outer/payload_bytes`, header included; DiLoCo's dense fp32
pseudo-gradient, 4·numel) and wire (what one rank transmits: the logged `outer/bytes_sent`, a
ring all-gather forwarding each other block once; DiLoCo's ring all-reduce 2·(N−1)/N·4·numel).
The headline is payload bytes, as the SparseLoCo paper counts; wire is given beside it.

Departures from the SparseLoCo paper's protocol, named: a 0.15M-parameter model (not 512M), 640
steps on three offline domains, N replicas on one shared CPU; only the outer lr is tuned (inner
AdamW, DiLoCo's Nesterov momentum 0.9, SparseLoCo's β = 0.95 and density, compressed NoLoCo's
momentum 0.5 and message sizes are fixed); the H grid is two values per method; compressed NoLoCo
runs at N ≥ 4 only (at N = 2 the same pair meets every round, the consensus message is identically
zero, DESIGN.md); uncompressed NoLoCo is benchmarks/noloco_convergence.py's; NoLoCo runs without
the heartbeat stall rule (`stall_s=null`); eval loss is rank 0's replica (NoLoCo's replicas differ).
The SparseLoCo configuration is whatever `algorithm.*` defaults the recorded SHA has, plus the
fields set in `_algorithm` (its record's `config` lists them).

    nohup python -m benchmarks.compressed_sync --parallel 3 > runs/compressed_sync.log 2>&1 &   # the full protocol
    # what results/ holds: compressed_sync = N=2 of the above at 4724cef (SparseLoCo then: flat 4096 chunks, max-abs);
    # compressed_sync_n4 = N=4 reduced to fit the shared box, at 7eddf4b (SparseLoCo: 64x64 tiles, statistical):
    nohup python -m benchmarks.compressed_sync --ranks 4 --methods diloco sparseloco --h-grid diloco:20 sparseloco:5 \
        --lr-start diloco:0.35 sparseloco:1.4 --max-extend 0 --parallel 2 --name compressed_sync_n4 > runs/n4.log 2>&1 &
    python -m benchmarks.compressed_sync --steps 40 --ranks 2 --seeds 1 --allow-dirty             # smoke
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import Harness, bench_parser, fmt, header, mean_std, parse, save_figure

METHODS = ("diloco", "sparseloco", "noloco_c")
# outer-lr ladder every grid is cut from (the outer optimizers accept (0, 4])
LADDER = (0.125, 0.18, 0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)
START = {"diloco": 0.7, "sparseloco": 1.0, "noloco_c": 0.7}  # each grid starts at this rung ± 1
H_GRID = {"diloco": (10, 20), "sparseloco": (5, 20), "noloco_c": (5, 20)}
MIN_RANKS = {"diloco": 2, "sparseloco": 2, "noloco_c": 4}


def _algorithm(job: dict[str, Any]) -> dict[str, Any]:
    m, h, lr = job["method"], job["h"], job["lr"]
    if m == "diloco":
        return {"name": "diloco", "inner_steps": h,
                "outer_optimizer": {"name": "sgd", "lr": lr, "momentum": 0.9, "nesterov": True}}
    if m == "noloco_c":
        return {"name": "noloco", "inner_steps": h, "outer_optimizer": {"name": "noloco", "lr": lr, "momentum": 0.5},
                "stall_s": None,
                "compression": {"enabled": True, "ef_decay": job["ef_decay"], "topk": job["topk"], "bits": job["bits"],
                                "state_topk": job["state_topk"], "state_bits": job["state_bits"],
                                "anchor_every": job["anchor_every"]}}
    return {"name": "sparseloco", "inner_steps": h, "outer_optimizer": {"name": "sgd", "lr": lr, "momentum": 0.0, "nesterov": False},
            "ef_decay": job["ef_decay"], "topk": job["topk"],
            "bits": job["bits"]}


def _config(job: dict[str, Any]) -> dict[str, Any]:
    micro = job["batch"] // job["ranks"]
    return {
        "algorithm": _algorithm(job),
        "model": {"hidden_size": job["hidden"], "num_layers": job["layers"], "num_heads": job["heads"],
                  "intermediate_size": job["intermediate"], "max_seq_len": job["seq_len"]},
        "data": {"seq_len": job["seq_len"], "max_bytes_per_domain": job["max_bytes"], "domains": job["domains"]},
        "optim": {"lr": job["inner_lr"], "warmup_steps": job["warmup"]},
        # the same held-out sequences at every N: eval_batches × micro_batch_size per domain
        "train": {"steps": job["steps"], "global_batch_size": job["batch"], "micro_batch_size": micro,
                  "eval_every": max(job["h"], job["eval_every"]), "eval_batches": max(1, job["eval_seqs"] // micro),
                  "checkpoint_every": 10**6, "threads": 1, "seed": job["seed"], "device": "cpu"},
        "logger": {"progress": False, "console": False, "log_every": job["h"]},
    }


def sync_bytes(method: str, rows: list[dict[str, Any]], numel: int, n: int) -> tuple[list[int], list[float], list[float]]:
    """(sync steps, payload bytes, wire bytes) of one replica's metrics rows."""
    if method == "diloco":
        steps = [r["step"] for r in rows if "outer/pseudo_grad_norm" in r]
        return steps, [4.0 * numel] * len(steps), [2.0 * (n - 1) / n * 4 * numel] * len(steps)
    syncs = [r for r in rows if "outer/bytes_sent" in r]
    if any(r.get("outer/payload_dropped") or r.get("outer/partner_missed") for r in syncs):
        raise RuntimeError("a payload or partner was dropped in a clean run")
    return [r["step"] for r in syncs], [r["outer/payload_bytes"] for r in syncs], [r["outer/bytes_sent"] for r in syncs]


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One run of N in-process replicas: rank 0's eval curve with cumulative bytes at each eval step."""
    import torch

    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process
    from decentrain.config import config_from_dict
    from decentrain.core.metrics import read_jsonl
    from decentrain.models.factory import build_model, build_tokenizer

    torch.set_num_threads(1)
    cfg = config_from_dict(_config(job))
    with tempfile.TemporaryDirectory(prefix="compressed_sync_") as d:
        runs = run_replicas_in_process(cfg, job["ranks"], Path(d))
        rows = read_jsonl(Path(d) / "metrics.jsonl")
    numel = sum(p.numel() for p in build_model(cfg.model, build_tokenizer(cfg.model)).parameters())
    steps, payload, wire = sync_bytes(job["method"], rows, numel, job["ranks"])
    curve = []
    for r in rows:
        if "eval/loss" in r:
            done = [i for i, s in enumerate(steps) if s <= r["step"]]
            curve.append([r["step"], r["eval/loss"], sum(payload[i] for i in done), sum(wire[i] for i in done)])
    return {"numel": numel, "curve": curve, "syncs": len(steps), "final": curve[-1][1]}


# -- tuning --------------------------------------------------------------------------------------
def start_grid(method: str, start: dict[str, float] | None = None) -> list[float]:
    i = LADDER.index((start or START)[method])
    return list(LADDER[max(i - 1, 0):i + 2])


def next_rungs(grid: list[float], finals: dict[float, float]) -> list[float]:
    """The rung to add when the best lr is on the grid's edge (none when it is inside or the ladder ends)."""
    best = min(grid, key=lambda lr: finals[lr])
    i = LADDER.index(best)
    if best == min(grid) and i > 0:
        return [LADDER[i - 1]]
    if best == max(grid) and i + 1 < len(LADDER):
        return [LADDER[i + 1]]
    return []


def tune(harness: Harness, shared: dict[str, Any], n: int, seed: int, max_extend: int, parallel: int,
         plan: dict[str, Any]) -> dict[str, Any]:
    """Per method and H: the lr grid run on `seed`, extended at an edge; the best lr and whether it is bracketed."""
    cells = {(m, h): start_grid(m, plan["start"]) for m in plan["methods"] if n >= MIN_RANKS[m] for h in plan["h_grid"][m]}
    finals: dict[tuple[str, int], dict[float, float]] = {c: {} for c in cells}
    for extension in range(max_extend + 1):
        jobs = [{**shared, "ranks": n, "method": m, "h": h, "lr": lr, "seed": seed}
                for (m, h), grid in cells.items() for lr in grid if lr not in finals[(m, h)]]
        for j, r in zip(jobs, harness.run_jobs(jobs, train_run, desc=f"tune N={n}", parallel=parallel)):
            finals[(j["method"], j["h"])][j["lr"]] = r["final"]
        grow = {c: next_rungs(grid, finals[c]) for c, grid in cells.items()}
        if extension == max_extend or not any(grow.values()):
            break
        cells = {c: sorted(grid + grow[c]) for c, grid in cells.items()}
    out: dict[str, Any] = {}
    for (m, h), grid in cells.items():
        best = min(grid, key=lambda lr: finals[(m, h)][lr])
        out.setdefault(m, {})[str(h)] = {"grid": grid, "finals": [finals[(m, h)][lr] for lr in grid], "lr": best,
                                         "bracketed": min(grid) < best < max(grid)}
    for m, by_h in out.items():
        best_h = min(by_h, key=lambda h: min(by_h[h]["finals"]))
        out[m]["best_h"] = int(best_h)
    return out


# -- figures -------------------------------------------------------------------------------------
def seed_mean_curve(runs: list[dict[str, Any]]) -> list[list[float]]:
    """[step, mean loss, mean payload bytes, mean wire bytes] over seeds, at the eval steps they share."""
    return [[c[0][0], *(sum(x) / len(x) for x in zip(*(cc[1:] for cc in c)))] for c in zip(*(r["curve"] for r in runs))]


def bytes_to(curve: list[list[float]], target: float) -> tuple[float, float, float] | None:
    """(step, payload, wire) at the first point of a curve at or below `target`."""
    for step, loss, payload, wire in curve:
        if loss <= target:
            return step, payload, wire
    return None


def paired(diffs: list[float]) -> dict[str, Any]:
    """Paired t-test of per-seed differences: mean, 95 % interval, p, and the smallest difference it can detect."""
    from scipy import stats

    n = len(diffs)
    ms = mean_std(diffs)
    if n < 2:
        return {**ms, "p": None, "ci95": None, "detectable": None}
    se = ms["std"] / math.sqrt(n)
    t975, t80 = stats.t.ppf(0.975, n - 1), stats.t.ppf(0.80, n - 1)
    p = float(stats.ttest_1samp(diffs, 0.0).pvalue) if se > 0 else (0.0 if ms["mean"] else 1.0)
    return {**ms, "p": p, "ci95": [ms["mean"] - t975 * se, ms["mean"] + t975 * se], "detectable": (t975 + t80) * se}


def figures_for(n: int, tuning: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One N's figures; `runs` maps 'method H=h' to its seeds' results (seed order)."""
    d_best = f"diloco H={tuning['diloco']['best_h']}"
    finals = {v: [r["final"] for r in rs] for v, rs in runs.items()}
    best_diloco = min((v for v in runs if v.startswith("diloco")), key=lambda v: mean_std(finals[v])["mean"])
    target = 1.01 * mean_std(finals[best_diloco])["mean"]
    base = bytes_to(seed_mean_curve(runs[best_diloco]), target)
    out: dict[str, Any] = {"ranks": n, "numel": next(iter(runs.values()))[0]["numel"], "diloco_best": best_diloco,
                           "diloco_best_tuning": d_best, "target_loss": target, "variants": {}}
    for v, rs in runs.items():
        curve = seed_mean_curve(rs)
        hit = bytes_to(curve, target)
        row = {"final": mean_std(finals[v]), "curve": curve, "syncs": rs[0]["syncs"],
               "payload_per_sync": curve[-1][2] / max(rs[0]["syncs"], 1), "wire_per_sync": curve[-1][3] / max(rs[0]["syncs"], 1),
               "vs_diloco_best": paired([a - b for a, b in zip(finals[v], finals[best_diloco])]),
               "to_target": None if hit is None else {"step": hit[0], "payload": hit[1], "wire": hit[2],
                                                       "payload_ratio": base[1] / hit[1] if hit[1] else None,
                                                       "wire_ratio": base[2] / hit[2] if hit[2] else None}}
        out["variants"][v] = row
    compressed = [(v, r["to_target"]["payload_ratio"]) for v, r in out["variants"].items()
                  if not v.startswith("diloco") and r["to_target"] is not None]
    out["best_ratio"] = max(compressed, key=lambda x: x[1]) if compressed else None
    return out


def text(record: dict) -> str:
    c = record["config"]
    lines = [header(record), "",
             f"{c['steps']} steps, global batch {c['batch']}, tuning seed {c['tune_seed']}, eval seeds {c['eval_seeds']}; "
             f"SparseLoCo top-{c['topk']} per 4096, {c['bits']}-bit, β={c['ef_decay']}; compressed NoLoCo: the same for Δ, "
             f"top-{c['state_topk']} {c['state_bits']}-bit for φ − A, re-anchor every {c['anchor_every']} rounds"]
    for key, f in record["figures"].items():
        lines += ["", f"== N={f['ranks']} ({f['numel']:,} parameters): target = DiLoCo's best final loss "
                      f"({f['diloco_best']}) + 1 % = {f['target_loss']:.4f}"]
        br = f["best_ratio"]
        lines.append(f"  highest payload-bytes ratio of a compressed method reaching it: "
                     + (f"{br[1]:.1f}x ({br[0]}); target >= 50x: {'MET' if br[1] >= 50 else 'NOT MET'}" if br
                        else "none reaches it; target >= 50x: NOT MET"))
        for v, r in f["variants"].items():
            t, p = r["to_target"], r["vs_diloco_best"]
            reach = ("never reaches the target" if t is None else
                     f"reaches it at step {t['step']:.0f}: {t['payload'] / 1e6:.4f} MB payload ({t['payload_ratio']:.1f}x fewer), "
                     f"{t['wire'] / 1e6:.4f} MB wire ({t['wire_ratio']:.1f}x fewer)")
            test = "" if p["p"] is None else (f"; paired vs DiLoCo-best {p['mean']:+.4f} [95 % CI {p['ci95'][0]:+.4f}, "
                                              f"{p['ci95'][1]:+.4f}], p={p['p']:.3f}, detectable ±{p['detectable']:.4f}")
            lines.append(f"  {v}: final {fmt(r['final'])}{test}")
            lines.append(f"    {r['payload_per_sync']:.0f} B payload/sync, {r['syncs']} syncs; {reach}")
        lines.append("  tuning (seed %d): outer lr grid -> final loss" % c["tune_seed"])
        for m, by_h in f["tuning"].items():
            for h, t in by_h.items():
                if h == "best_h":
                    continue
                grid = ", ".join(f"{lr:g}: {x:.4f}" for lr, x in zip(t["grid"], t["finals"]))
                lines.append(f"    {m} H={h}: {grid} -> lr {t['lr']:g}" + ("" if t["bracketed"] else "  (ON THE EDGE)"))
            lines.append(f"    {m}: best H = {by_h['best_h']}")
    return "\n".join(lines)


def plot(record: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    figs = record["figures"]
    fig, axes = plt.subplots(1, len(figs), figsize=(6 * len(figs), 4), squeeze=False)
    for ax, f in zip(axes[0], figs.values()):
        for v, r in f["variants"].items():
            pts = [(p[2], p[1]) for p in r["curve"] if p[2] > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=v)
        ax.axhline(f["target_loss"], ls="--", c="gray", label="DiLoCo best final + 1 %")
        ax.set_xscale("log")
        ax.set_xlabel("cumulative payload bytes per replica")
        ax.set_ylabel("eval loss (seed mean)")
        ax.set_title(f"N={f['ranks']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, png, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__.splitlines()[0], smoke={"steps": 40, "ranks": [2], "seeds": 1})
    ap.add_argument("--steps", type=int, default=640)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tune-seed", type=int, default=100)
    ap.add_argument("--equal-h", type=int, default=20)
    ap.add_argument("--max-extend", type=int, default=1, help="edge extensions of an lr grid")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (worker processes)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--h-grid", nargs="+", default=[], metavar="METHOD:H,H", help="replace a method's H grid")
    ap.add_argument("--lr-start", nargs="+", default=[], metavar="METHOD:LR", help="centre a method's first lr grid on a rung")
    ap.add_argument("--name", default="compressed_sync")
    args = parse(ap, argv)
    h_grid = {**H_GRID, **{m: tuple(int(h) for h in hs.split(",")) for m, hs in (x.split(":") for x in args.h_grid)}}
    plan = {"methods": args.methods, "h_grid": h_grid,
            "start": {**START, **{m: float(lr) for m, lr in (x.split(":") for x in args.lr_start)}}}
    config = {"steps": args.steps, "ranks": args.ranks, "tune_seed": args.tune_seed, "eval_seeds": list(range(args.seeds)),
              "equal_h": args.equal_h, "max_extend": args.max_extend, "ladder": LADDER, "plan": plan,
              "hidden": 64, "layers": 2, "heads": 2, "intermediate": 176, "seq_len": 64, "max_bytes": 100_000,
              "domains": ["python_stdlib", "python_docs", "licenses"], "batch": 16, "inner_lr": 1e-3, "warmup": 20,
              "eval_every": 20, "eval_seqs": 32, "topk": 64, "bits": 2, "ef_decay": 0.95, "state_topk": 32,
              "state_bits": 4, "anchor_every": 10}
    harness = Harness(args.name, __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    shared = {k: v for k, v in config.items() if k not in ("ranks", "tune_seed", "eval_seeds", "max_extend", "ladder", "plan")}
    figures: dict[str, Any] = {}
    for n in args.ranks:  # one N after the other: a run cut short still has a whole N
        tuned = tune(harness, shared, n, args.tune_seed, args.max_extend, args.parallel, plan)
        # equal H where the method's grid has it (a reduced --h-grid may not), and its own best H
        variants = {(m, h) for m in tuned for h in (args.equal_h, tuned[m]["best_h"]) if str(h) in tuned[m]}
        jobs = [{**shared, "ranks": n, "method": m, "h": h, "lr": tuned[m][str(h)]["lr"], "seed": s}
                for m, h in sorted(variants) for s in config["eval_seeds"]]
        results = harness.run_jobs(jobs, train_run, desc=f"seeds N={n}", parallel=args.parallel)
        runs: dict[str, list[dict[str, Any]]] = {}
        for j, r in zip(jobs, results):
            runs.setdefault(f"{j['method']} H={j['h']}", []).append(r)
        figures[f"N={n}"] = {**figures_for(n, tuned, runs), "tuning": tuned}
        paths = harness.write(figures, text, plot)
    print(paths["txt"].read_text())


if __name__ == "__main__":
    main()
