"""noloco_convergence: DDP vs DiLoCo vs NoLoCo on the same tiny model, data, tokens and seed.

Each algorithm runs the ordinary pre-training recipe with N local gloo workers; only
`algorithm=` differs. Eval loss is rank 0's replica on the held-out split of every
domain (for NoLoCo that is one replica, not an average: replicas are never all-reduced).
H is a multiple of the eval interval so the last eval follows an outer step.

    python -m benchmarks.noloco_convergence                 # 4 workers, ~8 min on 2 cores
    python -m benchmarks.noloco_convergence --steps 60      # smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ("ddp", "diloco", "noloco")


def run(algorithm: str, args: argparse.Namespace, run_dir: Path) -> tuple[list[tuple[int, float]], float]:
    overrides = [
        f"algorithm={algorithm}", f"launcher.nproc_per_node={args.workers}", f"train.steps={args.steps}",
        f"train.global_batch_size={args.global_batch}", f"train.micro_batch_size={args.micro_batch}",
        f"train.eval_every={args.eval_every}", "train.eval_batches=4", f"train.checkpoint_every={args.steps}",
        f"train.seed={args.seed}", "train.threads=1", f"optim.lr={args.lr}", "logger.progress=false",
        f"logger.log_every={args.eval_every}", f"run_dir={run_dir}", "resume=false",
    ]
    if algorithm != "ddp":
        overrides.append(f"algorithm.inner_steps={args.inner_steps}")
    if algorithm == "noloco":
        overrides += [f"algorithm.outer_lr={args.noloco_lr}", f"algorithm.outer_momentum={args.noloco_momentum}"]
    if algorithm == "diloco":
        overrides += [f"algorithm.outer_lr={args.diloco_lr}", f"algorithm.outer_momentum={args.diloco_momentum}",
                      f"algorithm.nesterov={str(args.diloco_momentum > 0).lower()}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "recipes.train", *overrides], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{algorithm} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/loss"]) for r in records if "eval/loss" in r], wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--inner-steps", type=int, default=20, help="H for DiLoCo and NoLoCo")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3, help="inner AdamW lr (DDP's lr too)")
    ap.add_argument("--diloco-lr", type=float, default=0.7)
    ap.add_argument("--diloco-momentum", type=float, default=0.9)
    ap.add_argument("--noloco-lr", type=float, default=0.7)
    ap.add_argument("--noloco-momentum", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "noloco_convergence"))
    args = ap.parse_args()
    if args.inner_steps % args.eval_every and args.eval_every % args.inner_steps:
        ap.error("--inner-steps and --eval-every must divide one another (evaluate right after outer steps)")
    sys.path.insert(0, str(ROOT))
    from benchmarks.results_io import RESULTS, write_results

    curves, walls = {}, {}
    for algo in args.algorithms:
        print(f"[noloco_convergence] {algo} ...", flush=True)
        curves[algo], walls[algo] = run(algo, args, Path(args.runs_dir) / algo)
        print(f"  final eval loss {curves[algo][-1][1]:.4f} in {walls[algo]:.0f}s", flush=True)
    final = {a: c[-1][1] for a, c in curves.items()}
    seq_len = 128  # conf/data/offline.yaml
    figures = {
        "tokens": args.steps * args.global_batch * seq_len,
        "eval_loss_curves": {a: [{"step": s, "eval_loss": v} for s, v in c] for a, c in curves.items()},
        "final_eval_loss": final,
        "final_perplexity": {a: math.exp(v) for a, v in final.items()},
        "wall_s": walls,
    }
    if "diloco" in final and "noloco" in final:
        figures["noloco_vs_diloco_pct"] = 100 * (final["noloco"] / final["diloco"] - 1)
        figures["target_noloco_within_1pct_of_diloco"] = figures["noloco_vs_diloco_pct"] <= 1.0
    out = write_results("noloco_convergence", vars(args), figures)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for a, c in curves.items():
        ax.plot([s for s, _ in c], [v for _, v in c], "o-", ms=3, label=f"{a} ({final[a]:.3f})")
    ax.set(xlabel="inner step", ylabel="eval loss (rank 0 replica)", title=f"{args.workers} workers, {figures['tokens'] / 1e6:.2f}M tokens, H={args.inner_steps}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "noloco_convergence.png", dpi=120)

    ddp = final.get("ddp")
    print(f"{'algorithm':10s} {'eval loss':>9s} {'ppl':>8s} {'vs DDP':>8s} {'wall s':>7s}")
    for a in curves:
        gap = f"{100 * (final[a] / ddp - 1):+7.2f}%" if ddp else "-"
        print(f"{a:10s} {final[a]:9.4f} {math.exp(final[a]):8.3f} {gap:>8s} {walls[a]:7.0f}")
    if "noloco_vs_diloco_pct" in figures:
        print(f"NoLoCo vs DiLoCo final eval loss: {figures['noloco_vs_diloco_pct']:+.2f}% (target <= +1%)")
    print(f"wrote {out} and {RESULTS / 'noloco_convergence.png'}")


if __name__ == "__main__":
    main()
