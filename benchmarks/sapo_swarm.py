"""sapo_swarm: the SAPO paper's I/J table (8/0, 6/2, 4/4, 2/6) at tiny CPU scale.

One SFT warm start (cached under .cache/, never committed), then, for each I/J split, a
collective swarm of N nodes started by the ordinary recipe (`python -m recipes.rl`), all from
that checkpoint, for the same number of rounds with the same seeds. A node's reward per round
is the mean verifier reward of its own G completions; its cumulative reward is the sum over
rounds; a config's figure is the sum over its nodes (and the mean per node).

    python -m benchmarks.sapo_swarm                       # 4 nodes, sized for ~15 min on 2 cores
    python -m benchmarks.sapo_swarm --rounds 3 --sft-steps 20   # smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results_io import RESULTS, write_results

ROOT = Path(__file__).resolve().parents[1]
PAPER = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}


def _run(module: str, overrides: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", module, *overrides], cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{module} {overrides} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - t0


def warm_start(args: argparse.Namespace) -> tuple[Path, dict]:
    """The SFT checkpoint, keyed by its settings: trained once, reused by every later run."""
    overrides = [f"sft.steps={args.sft_steps}", "sft.batch_size=32", "sft.lr=2e-3", f"sft.seed={args.seed}"]
    key = hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:10]
    cache = Path(args.cache_dir) / f"sapo_sft_{key}"
    if not (cache / "sft_eval.json").exists():
        print(f"SFT warm start ({args.sft_steps} steps) -> {cache}", flush=True)
        _run("recipes.sft", [*overrides, "sft.threads=2", "logger.progress=false", f"run_dir={cache}", f"out_dir={cache / 'model'}"])
    return cache / "model", json.loads((cache / "sft_eval.json").read_text())


def run_config(split: str, model_dir: Path, args: argparse.Namespace, run_dir: Path) -> dict:
    i, j = split.split("/")
    overrides = [
        f"sapo=swarm_{i}_{j}", f"num_nodes={args.nodes}", f"train.rounds={args.rounds}", f"train.seed={args.seed}",
        f"model.pretrained={model_dir}", f"model.tokenizer={model_dir}", f"optim.lr={args.lr}",
        f"sampling.max_new_tokens={args.max_new_tokens}", "train.micro_batch_size=64", "train.threads=1",
        "train.checkpoint_every=0", "logger.progress=false", f"run_dir={run_dir}", "resume=false",
    ]
    if args.aggregate_only:  # re-read finished runs (e.g. after a plotting change); wall time from the old JSON
        old = json.loads((RESULTS / f"{args.name}.json").read_text())["figures"]["configs"].get(split, {})
        wall = old.get("wall_s", float("nan"))
    else:
        shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl appends: start clean
        wall = _run("recipes.rl", overrides)
    nodes = {}
    for n in range(args.nodes):
        lines = (run_dir / f"node{n}" / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines][-args.rounds:]  # this run's rounds only
        nodes[f"node{n}"] = {
            "reward": [r["reward"] for r in rows],
            "cumulative_reward": rows[-1]["cumulative_reward"],
            "external_groups": sum(r["external_groups"] for r in rows),
            "local_groups": sum(r["local_groups"] for r in rows),
            "payloads_dropped": rows[-1]["payloads_dropped"],
            "time": {k: sum(r[f"time_{k}"] for r in rows) / len(rows) for k in ("generate", "exchange", "train", "round")},
        }
    per_round = [sum(v["reward"][t] for v in nodes.values()) / args.nodes for t in range(args.rounds)]
    total = sum(v["cumulative_reward"] for v in nodes.values())
    return {"split": split, "wall_s": wall, "swarm_cumulative_reward": total, "mean_cumulative_reward": total / args.nodes,
            "mean_reward_per_round": per_round, "nodes": nodes}


def plot(results: dict, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for split, r in results.items():
        curve = np.array(r["mean_reward_per_round"])
        a.plot(np.arange(1, len(curve) + 1), np.cumsum(curve) * len(r["nodes"]), label=f"I/J={split}")
        w = min(5, len(curve))
        b.plot(np.arange(w, len(curve) + 1), np.convolve(curve, np.ones(w) / w, mode="valid"), label=f"I/J={split}")
    a.set(xlabel="round", ylabel="swarm cumulative reward", title="SAPO swarm: cumulative reward")
    b.set(xlabel="round", ylabel="mean reward per node (5-round moving avg)", title="reward per round")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--splits", default="8/0,6/2,4/4,2/6")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=str(ROOT / ".cache"))
    ap.add_argument("--name", default="sapo_swarm")
    ap.add_argument("--aggregate-only", action="store_true", help="re-read the runs under runs/bench/<name>, run nothing")
    args = ap.parse_args()

    t0 = time.perf_counter()
    model_dir, sft = warm_start(args)
    results = {}
    for split in args.splits.split(","):
        print(f"I/J={split}: {args.nodes} nodes x {args.rounds} rounds", flush=True)
        results[split] = run_config(split, model_dir, args, ROOT / "runs" / "bench" / args.name / split.replace("/", "_"))
    base = results.get("8/0", {}).get("swarm_cumulative_reward")
    rows = []
    for split, r in results.items():
        ratio = r["swarm_cumulative_reward"] / base if base else None
        r["ratio_to_8_0"] = ratio
        t = {k: sum(n["time"][k] for n in r["nodes"].values()) / args.nodes for k in ("generate", "exchange", "train", "round")}
        r["mean_round_time_s"] = t
        paper = PAPER[split] / PAPER["8/0"] if split in PAPER else None
        rows.append((split, r["swarm_cumulative_reward"], r["mean_cumulative_reward"], ratio, paper, t, r["wall_s"]))

    total_wall = sum(r["wall_s"] for r in results.values()) if args.aggregate_only else time.perf_counter() - t0
    figures = {"sft": sft, "configs": results, "paper_cumulative_reward": PAPER, "total_wall_s": total_wall}
    out = write_results(args.name, vars(args), figures)
    plot(results, RESULTS / f"{args.name}.png")
    print(f"\nSFT warm start ({sft['steps']} steps): " + ", ".join(
        f"{t} {a['sampled_accuracy']:.1%} sampled / {a['greedy_accuracy']:.1%} greedy" for t, a in sft["accuracy"].items()))
    print("\n| I/J | swarm cum. reward | per node | ratio to 8/0 | paper ratio | round s (gen/exch/train) | wall s |")
    print("|---|---|---|---|---|---|---|")
    for split, total, mean, ratio, paper, t, wall in rows:
        print(f"| {split} | {total:.2f} | {mean:.2f} | {ratio:.2f}x | {paper:.2f}x | "
              f"{t['round']:.2f} ({t['generate']:.2f}/{t['exchange']:.2f}/{t['train']:.2f}) | {wall:.0f} |")
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
