"""sapo_swarm: the SAPO paper's I/J comparison (4/4 vs 8/0 cumulative reward) at tiny CPU scale, over seeds.

One SFT warm start (cached under .cache/ by its settings, never committed), then, for each I/J
split and seed, a collective swarm of N nodes started by the ordinary recipe
(`python -m recipes.rl`), all from that checkpoint, for the same number of rounds. Seeds change
the RL run (question draws, sampling, node seeds), not the warm start. A node's reward per round
is the mean verifier reward of its own G completions; its cumulative reward is the sum over
rounds; a run's figure is the sum over its nodes. The headline is 4/4 over 8/0 per seed
(paired by seed), mean ± std over seeds; target >= 1.5x (paper: 1093.31 / 561.79 = 1.95x).

Every knob (lr, task mix, warm start, G, rounds) is the same for every split: only I/J differ.
Diagnostics, per split and over rounds: the share of local groups with mixed rewards (the groups
that carry a GRPO signal), the share of received external groups that carry signal, external
groups used per round, per-node reward curves, and the reward difference 4/4 - 8/0 with the
drawdowns of each smoothed curve (the learning-forgetting oscillation).

Each (split, seed) run is one harness job: its result is cached when it finishes, and the
recipe checkpoints every `checkpoint_every` rounds into a run dir named by the job, so an
interrupted benchmark resumes the unfinished run where it stopped.

    python -m benchmarks.sapo_swarm                                  # the paper's table: 8 nodes, 4 splits, 150 rounds, 3 seeds (~10 CPU-h)
    python -m benchmarks.sapo_swarm --rounds 30                      # the committed result (90 min on 2 loaded cores)
    python -m benchmarks.sapo_swarm --splits 8/0,4/4                 # the headline pair only
    python -m benchmarks.sapo_swarm --nodes 2 --rounds 3 --sft-steps 20 --seeds 1 --allow-dirty   # smoke run
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.harness import Harness, config_key, fmt, header, mean_std, config_parser, parse_config

ROOT = Path(__file__).resolve().parents[1]
PAPER = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}
TARGET = 1.5
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
SMOOTH = 20
# rounds in the moving averages of curves and drawdowns


@dataclass
class BenchConfig:
    # The paper's table: 8 nodes, splits 8/0, 6/2, 4/4, 2/6. A node's round costs ~1-2 CPU-s here
    # (generate 8x8 completions, one step), so the full table (8 nodes x 4 splits x 3 seeds) is
    # ~10 CPU-h; runs on 2 shared cores pass --nodes/--splits/--rounds/--seeds and name it.
    nodes: int = 8
    rounds: int = 150
    splits: str = "8/0,6/2,4/4,2/6"
    # Both arms alike: the single-node learning setup of conf/sapo/learn_cpu.yaml (T=1,
    # top-k off, exact-match reward, lr inside the stable range; benchmarks/sapo_learning.py gates it).
    lr: float = 3e-4
    temperature: float = 1.0
    max_new_tokens: int = 8
    task: str = "sapo_mix"  # conf/task/<task>.yaml the warm start is trained on
    rl_task: str = "sapo_learn"  # conf/task/<rl_task>.yaml the RL runs draw from (three vetted tasks, each node its own seeded stream)
    sft_steps: int = 250
    sft_lr: float = 2e-3
    sft_seed: int = 0
    eval_prompts: int = 32  # per task, for the warm start's accuracy (G completions each)
    heldout_every: int = 25  # rounds between held-out greedy evaluations on every node
    heldout_prompts: int = 64  # per task
    checkpoint_every: int = 25
    cache_dir: str = ".cache"  # SFT warm starts (git-ignored)
    work_dir: str = "runs/bench/sapo_swarm"  # RL run dirs (git-ignored)


def _run(module: str, overrides: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", module, *overrides], cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{module} {overrides} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - t0


def sft_overrides(b: BenchConfig) -> list[str]:
    return [f"sft.steps={b.sft_steps}", "sft.batch_size=32", f"sft.lr={b.sft_lr}", f"sft.seed={b.sft_seed}",
            f"sampling.max_new_tokens={b.max_new_tokens}", f"eval.prompts_per_task={b.eval_prompts}",
            "eval.num_generations=8", f"task={b.task}"]


def warm_start(b: BenchConfig) -> tuple[Path, dict]:
    """The SFT checkpoint, keyed by its settings: trained once, reused by every later run."""
    overrides = sft_overrides(b)
    key = hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:10]
    cache = ROOT / b.cache_dir / f"sapo_sft_{key}"
    if not (cache / "sft_eval.json").exists():
        print(f"SFT warm start ({b.sft_steps} steps) -> {cache.relative_to(ROOT)}", flush=True)
        _run("recipes.sft", [*overrides, "sft.threads=1", "logger.progress=false", f"run_dir={cache}", f"out_dir={cache / 'model'}"])
    return cache / "model", json.loads((cache / "sft_eval.json").read_text())


def rl_overrides(b: BenchConfig, split: str, seed: int, model_dir: str, run_dir: Path) -> list[str]:
    i, j = split.split("/")
    return [f"sapo=swarm_{i}_{j}", f"num_nodes={b.nodes}", f"train.rounds={b.rounds}", f"train.seed={seed}",
            f"model.pretrained={ROOT / model_dir}", f"model.tokenizer={ROOT / model_dir}", f"optim.lr={b.lr}",
            f"sampling.max_new_tokens={b.max_new_tokens}", f"sampling.temperature={b.temperature}", "sampling.top_k=null",
            "reward.kind=exact", "train.micro_batch_size=64", "train.threads=1",
            f"eval.every={b.heldout_every}", f"eval.prompts_per_task={b.heldout_prompts}",
            f"train.checkpoint_every={b.checkpoint_every}", "train.keep_checkpoints=1", "logger.progress=false",
            f"run_dir={run_dir}", "resume=true", f"task={b.rl_task}"]


def _rows(path: Path) -> list[dict]:
    """One row per round: a resumed run re-logs rounds after its checkpoint, so the last row wins."""
    rows: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
            rows[int(r["step"])] = r
        except (ValueError, KeyError, TypeError):
            continue
    return [rows[k] for k in sorted(rows)]


def run_job(job: dict) -> dict:
    """One swarm run (split, seed) through the recipe; returns per-node per-round series."""
    b = BenchConfig(**job["bench"])
    run_dir = ROOT / b.work_dir / f"{job['split'].replace('/', '_')}_seed{job['seed']}_{config_key(job)[:8]}"
    wall = _run("recipes.rl", rl_overrides(b, job["split"], job["seed"], job["model_dir"], run_dir))
    nodes = {}
    for n in range(b.nodes):
        all_rows = _rows(run_dir / f"node{n}" / "metrics.jsonl")
        rows = [r for r in all_rows if int(r["step"]) >= 1]  # step 0: the starting policy's held-out eval
        if len(rows) != b.rounds:
            raise RuntimeError(f"node{n} logged {len(rows)} rounds, expected {b.rounds}")
        col = lambda k, d=0.0: [round(float(r.get(k, d)), 5) for r in rows]  # noqa: E731
        nodes[f"node{n}"] = {
            "reward": col("reward"),
            "batch_reward": col("batch_reward"),  # genrl's train/rewards: mean over the training batch
            "heldout": {int(r["step"]): r["heldout_greedy/mean"] for r in all_rows if "heldout_greedy/mean" in r},
            "local_groups": col("local_groups"),
            "local_mixed_groups": col("local_mixed_groups"),
            "external_received": col("external_received"),
            "external_equal_rewards": col("external_equal_rewards"),
            "external_unscorable": col("external_unscorable"),
            "external_groups": col("external_groups"),
            "trained_completions": col("trained_completions"),
            "accuracy": [round(float(np.mean([v for k, v in r.items() if k.startswith("accuracy/")])), 5) for r in rows],
            "payloads_dropped": rows[-1].get("payloads_dropped", 0),
            "time_s": {k: float(np.mean([r[f"time_{k}"] for r in rows])) for k in ("generate", "exchange", "train", "round")},
        }
    return {"wall_s": wall, "nodes": nodes}


# -- analysis ------------------------------------------------------------------------------
def _smooth(x: np.ndarray, w: int | None = None) -> np.ndarray:
    w = max(1, min(w or SMOOTH, len(x)))
    return np.convolve(x, np.ones(w) / w, mode="valid")


def _sx(curve) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, values) of a curve's moving average, each value at the round its window ends."""
    s = _smooth(np.asarray(curve, dtype=float))
    return np.arange(len(curve) - len(s) + 1, len(curve) + 1), s


def drawdowns(curve: np.ndarray, window: int | None = None) -> dict[str, float]:
    """Forgetting in a smoothed reward curve: the largest fall from a running peak, and the sum of all falls."""
    s = _smooth(curve, window)
    peak = np.maximum.accumulate(s)
    falls = np.clip(-np.diff(s), 0, None)
    return {"max_drawdown": float((peak - s).max()), "total_fall": float(falls.sum()), "total_rise": float(np.clip(np.diff(s), 0, None).sum())}


def summarize_run(run: dict, num_external: int) -> dict:
    nodes = run["nodes"]
    reward = np.array([v["reward"] for v in nodes.values()])  # [nodes, rounds]
    local = np.array([v["local_groups"] for v in nodes.values()])
    mixed = np.array([v["local_mixed_groups"] for v in nodes.values()])
    recv = np.array([v["external_received"] for v in nodes.values()])
    equal = np.array([v["external_equal_rewards"] for v in nodes.values()])
    unscorable = np.array([v["external_unscorable"] for v in nodes.values()])
    used = np.array([v["external_groups"] for v in nodes.values()])
    scorable = (recv - unscorable) if num_external else np.zeros_like(recv)  # J=0 scores no peer group
    curve = reward.mean(0)
    batch = np.array([v["batch_reward"] for v in nodes.values()])
    steps = sorted(set.intersection(*(set(int(k) for k in v["heldout"]) for v in nodes.values())))
    heldout = np.array([[v["heldout"].get(k, v["heldout"].get(str(k))) for k in steps] for v in nodes.values()])  # [nodes, evals]
    return {
        "batch_cumulative_reward": float(batch.sum()),  # the paper's statistic (genrl's train/rewards, summed)
        "heldout_steps": steps, "heldout_per_eval": heldout.mean(0).round(4).tolist(),
        "heldout_start": float(heldout[:, 0].mean()), "heldout_final": float(heldout[:, -1].mean()),
        "heldout_gain": float((heldout[:, -1] - heldout[:, 0]).mean()),
        "swarm_cumulative_reward": float(reward.sum()),
        "per_node_cumulative_reward": reward.sum(1).tolist(),
        "mean_reward_per_round": curve.round(5).tolist(),
        "local_mixed_share": float(mixed.sum() / max(local.sum(), 1)),
        "local_mixed_share_per_round": (mixed.sum(0) / np.maximum(local.sum(0), 1)).round(4).tolist(),
        "external_signal_share": float((scorable - equal).sum() / scorable.sum()) if scorable.sum() else None,
        "external_signal_share_per_round": ((scorable - equal).sum(0) / np.maximum(scorable.sum(0), 1)).round(4).tolist()
        if scorable.sum() else None,
        "external_used_per_round": float(used.mean()),
        "signal_groups_per_round": float((mixed + used).mean()),  # groups with non-zero advantage in a node's batch
        "accuracy_first_5": float(np.mean([v["accuracy"][:5] for v in nodes.values()])) if all(v.get("accuracy") for v in nodes.values()) else None,
        "local_mixed_share_first_5": float(mixed[:, :5].sum() / max(local[:, :5].sum(), 1)),
        "reward_first_10": float(reward[:, :10].mean()), "reward_last_10pct": float(reward[:, -max(1, reward.shape[1] // 10):].mean()),
        "drawdowns": drawdowns(curve),
        "per_node_drawdowns": [drawdowns(r)["max_drawdown"] for r in reward],
        "mean_round_time_s": {k: float(np.mean([v["time_s"][k] for v in nodes.values()])) for k in ("generate", "exchange", "train", "round")},
        "wall_s": run["wall_s"],
    }


def paired(runs: list[dict], base: list[dict], key: str) -> dict:
    """Split minus 8/0 on one statistic, paired by seed: mean ± std of the differences and the paired t-test."""
    d = np.array([r[key] - b[key] for r, b in zip(runs, base)], dtype=float)
    out = {"diff": mean_std(d.tolist()), "n": len(d)}
    if len(d) > 1 and d.std(ddof=1) > 0:
        from scipy.stats import ttest_rel

        t = ttest_rel([r[key] for r in runs], [b[key] for b in base])
        out.update(t=float(t.statistic), p=float(t.pvalue))
    return out


def analyze(b: BenchConfig, seeds: list[int], runs: dict[tuple[str, int], dict]) -> dict:
    splits = b.splits.split(",")
    per = {sp: [summarize_run(runs[sp, s], int(sp.split("/")[1])) for s in seeds] for sp in splits}
    out: dict = {"splits": {}}
    for sp in splits:
        rs = per[sp]
        out["splits"][sp] = {
            "batch_cumulative_reward": mean_std([r["batch_cumulative_reward"] for r in rs]),
            "heldout_start": mean_std([r["heldout_start"] for r in rs]),
            "heldout_final": mean_std([r["heldout_final"] for r in rs]),
            "heldout_gain": mean_std([r["heldout_gain"] for r in rs]),
            "heldout_per_eval": np.mean([r["heldout_per_eval"] for r in rs], 0).round(4).tolist(),
            "heldout_steps": rs[0]["heldout_steps"],
            "swarm_cumulative_reward": mean_std([r["swarm_cumulative_reward"] for r in rs]),
            "mean_cumulative_reward_per_node": mean_std([r["swarm_cumulative_reward"] / b.nodes for r in rs]),
            "local_mixed_share": mean_std([r["local_mixed_share"] for r in rs]),
            "external_signal_share": mean_std([r["external_signal_share"] for r in rs]) if rs[0]["external_signal_share"] is not None else None,
            "external_used_per_round": mean_std([r["external_used_per_round"] for r in rs]),
            "signal_groups_per_round": mean_std([r["signal_groups_per_round"] for r in rs]),
            "reward_first_10": mean_std([r["reward_first_10"] for r in rs]),
            "reward_last_10pct": mean_std([r["reward_last_10pct"] for r in rs]),
            "max_drawdown": mean_std([r["drawdowns"]["max_drawdown"] for r in rs]),
            "total_fall": mean_std([r["drawdowns"]["total_fall"] for r in rs]),
            "mean_reward_per_round": np.mean([r["mean_reward_per_round"] for r in rs], 0).round(5).tolist(),
            "per_seed": rs,
        }
        if "8/0" in per and sp != "8/0":
            ratios = [r["swarm_cumulative_reward"] / base["swarm_cumulative_reward"] for r, base in zip(rs, per["8/0"])]
            out["splits"][sp]["ratio_to_8_0"] = mean_std(ratios)
            out["splits"][sp]["batch_ratio_to_8_0"] = mean_std(
                [r["batch_cumulative_reward"] / base["batch_cumulative_reward"] for r, base in zip(rs, per["8/0"])])
            # Held-out gain over 8/0's: a ratio of means (a per-seed ratio of small gains is unstable).
            base_gain = np.mean([base["heldout_gain"] for base in per["8/0"]])
            out["splits"][sp]["heldout_gain_ratio_to_8_0"] = float(np.mean([r["heldout_gain"] for r in rs]) / base_gain) if base_gain else None
            out["splits"][sp]["paired_vs_8_0"] = {k: paired(rs, per["8/0"], k) for k in ("heldout_gain", "batch_cumulative_reward", "swarm_cumulative_reward")}
            diff = np.mean([np.array(r["mean_reward_per_round"]) - np.array(base["mean_reward_per_round"])
                            for r, base in zip(rs, per["8/0"])], 0)
            out["splits"][sp]["reward_minus_8_0_per_round"] = diff.round(5).tolist()
    firsts = [r for sp in splits for r in per[sp]]
    out["rl_start"] = {  # the first 5 rounds of every run, at the RL sampling temperature
        "accuracy": mean_std([r["accuracy_first_5"] for r in firsts]) if all(r["accuracy_first_5"] is not None for r in firsts) else None,
        "local_mixed_share": mean_std([r["local_mixed_share_first_5"] for r in firsts])}
    if "4/4" in out["splits"] and "ratio_to_8_0" in out["splits"]["4/4"]:
        out["ratio_4_4"] = out["splits"]["4/4"]["ratio_to_8_0"]
        out["batch_ratio_4_4"] = out["splits"]["4/4"]["batch_ratio_to_8_0"]
        out["heldout_gain_ratio_4_4"] = out["splits"]["4/4"]["heldout_gain_ratio_to_8_0"]
        # Issue 18's target: 4/4's held-out accuracy gain >= 1.5x 8/0's.
        out["target_met"] = out["heldout_gain_ratio_4_4"] is not None and out["heldout_gain_ratio_4_4"] >= TARGET
    return out


def main() -> None:
    b, nseeds, allow_dirty, fresh = parse_config(config_parser(BenchConfig, __doc__), BenchConfig)
    seeds = list(range(nseeds))
    splits = b.splits.split(",")
    hz = Harness("sapo_swarm", __file__, {"bench": asdict(b), "seeds": seeds, "sft_overrides": sft_overrides(b),
                                          "rl_overrides_example": rl_overrides(b, splits[-1], 0, "<sft model>", Path("<run dir>"))},
                 allow_dirty=allow_dirty, fresh=fresh)
    t0 = time.perf_counter()
    model_dir, sft = warm_start(b)
    sft_wall = time.perf_counter() - t0
    model_rel = model_dir.relative_to(ROOT).as_posix()
    # Seeds outer, splits inner: an interrupted benchmark has complete paired seeds.
    jobs = [{"bench": asdict(b), "split": sp, "seed": s, "model_dir": model_rel} for s in seeds for sp in splits]
    results = hz.run_jobs(jobs, run_job, desc=f"sapo swarm ({b.nodes} nodes x {b.rounds} rounds)")
    runs = {(j["split"], j["seed"]): r for j, r in zip(jobs, results)}
    acc = sft["accuracy"]
    prompts = sum(a["prompts"] for a in acc.values())
    figures = {
        "sft": {**sft, "wall_s_this_invocation": sft_wall,
                "start_sampled_accuracy": float(np.mean([a["sampled_accuracy"] for a in acc.values()])),
                "start_mixed_share_g8": sum(a["mixed_groups"] for a in acc.values()) / prompts},
        **analyze(b, seeds, runs),
        "paper_cumulative_reward": PAPER, "target": f"4/4 >= {TARGET}x 8/0 (mean over seeds)",
        "runs_raw": {f"{sp}/seed{s}": runs[sp, s] for s in seeds for sp in splits},
    }
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


def text(rec: dict) -> str:
    f, b = rec["figures"], rec["config"]["bench"]
    sft = f["sft"]
    lines = [header(rec), "",
             f"{b['nodes']} nodes x {b['rounds']} rounds, G=8, RL task mix conf/task/{b.get('rl_task', b['task'])}.yaml (warm start on "
             f"conf/task/{b['task']}.yaml), exact-match reward, T={b['temperature']}, "
             f"top-k off, RL lr {b['lr']}, max_new_tokens {b['max_new_tokens']}, seeds {rec['config']['seeds']}",
             f"warm start: {sft['steps']} SFT steps; sampled accuracy " + ", ".join(
                 f"{t} {a['sampled_accuracy']:.1%}" for t, a in sft["accuracy"].items())
             + f" (mean {sft['start_sampled_accuracy']:.1%}, T=1); prompts with mixed rewards at G=8: {sft['start_mixed_share_g8']:.1%}",
             f"RL start (first 5 rounds of every run, T={b['temperature']}): exact accuracy "
             + (fmt(f["rl_start"]["accuracy"], 3) if f["rl_start"]["accuracy"] else "-")
             + f", share of local groups with mixed rewards {fmt(f['rl_start']['local_mixed_share'], 3)}", "",
             "| I/J | swarm cum. reward | per node | ratio to 8/0 (per seed) | paper | local mixed | ext. signal | ext. used/round | "
             "reward first 10 -> last 10% | max drawdown | round s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for sp, r in f["splits"].items():
        ratio = r.get("ratio_to_8_0")
        rtxt = f"{fmt(ratio, 2)}x ({', '.join(f'{v:.2f}' for v in ratio['values'])})" if ratio else "1"
        paper = f"{PAPER[sp] / PAPER['8/0']:.2f}x" if sp in PAPER else "-"
        ext = fmt(r["external_signal_share"], 2) if r["external_signal_share"] else "-"
        t = np.mean([s["mean_round_time_s"]["round"] for s in r["per_seed"]])
        lines.append(f"| {sp} | {fmt(r['swarm_cumulative_reward'], 1)} | {fmt(r['mean_cumulative_reward_per_node'], 1)} | {rtxt} | {paper} | "
                     f"{fmt(r['local_mixed_share'], 2)} | {ext} | {fmt(r['external_used_per_round'], 2)} | "
                     f"{r['reward_first_10']['mean']:.3f} -> {r['reward_last_10pct']['mean']:.3f} | {fmt(r['max_drawdown'], 3)} | {t:.2f} |")
    lines += ["", "Side by side: the paper's cumulative reward (genrl's train/rewards: mean over the training batch, external "
              "groups included, summed over rounds and nodes), the nodes' own-rollout reward, and held-out greedy accuracy "
              "(mean over nodes, start -> final).",
              "| I/J | paper's cum. reward (batch) | ratio to 8/0 (paper 8/0=1) | own-rollout cum. reward | ratio to 8/0 | held-out start -> final | held-out gain | gain / 8/0's |",
              "|---|---|---|---|---|---|---|---|"]
    for sp, r in f["splits"].items():
        br, orr = r.get("batch_ratio_to_8_0"), r.get("ratio_to_8_0")
        gr = r.get("heldout_gain_ratio_to_8_0")
        paper = f" (paper {PAPER[sp] / PAPER['8/0']:.2f}x)" if sp in PAPER else ""
        lines.append(f"| {sp} | {fmt(r['batch_cumulative_reward'], 1)} | {(fmt(br, 2) + 'x') if br else '1'}{paper} | "
                     f"{fmt(r['swarm_cumulative_reward'], 1)} | {(fmt(orr, 2) + 'x') if orr else '1'} | "
                     f"{r['heldout_start']['mean']:.3f} -> {r['heldout_final']['mean']:.3f} | {fmt(r['heldout_gain'], 3)} | "
                     f"{'-' if gr is None and sp == '8/0' else ('1' if sp == '8/0' else f'{gr:.2f}x' if gr is not None else 'n/a (8/0 gain 0)')} |")
    for sp, r in f["splits"].items():
        if "paired_vs_8_0" in r:
            parts = []
            for k, v in r["paired_vs_8_0"].items():
                test = f", paired t={v['t']:.2f} p={v['p']:.3f}" if "t" in v else ""
                parts.append(f"{k} {fmt(v['diff'], 3)}{test}")
            lines.append(f"{sp} minus 8/0 per seed (n={next(iter(r['paired_vs_8_0'].values()))['n']}): " + "; ".join(parts))
    if "ratio_4_4" in f:
        g = f["heldout_gain_ratio_4_4"]
        lines += ["", f"target: 4/4's held-out gain >= {TARGET}x 8/0's: {('%.2fx' % g) if g is not None else 'n/a'} -> "
                      f"{'MET' if f['target_met'] else 'NOT MET'}; paper's cumulative-reward ratio 4/4 / 8/0 "
                      f"{fmt(f['batch_ratio_4_4'], 2)}x (paper 1.95x); own-rollout ratio {fmt(f['ratio_4_4'], 2)}x"]
    lines += ["local mixed = share of a node's own groups with non-equal rewards; ext. signal = share of received peer groups "
              "with non-equal rewards (the ones J draws from); max drawdown = largest fall of the "
              f"{SMOOTH}-round moving average of mean reward from its running peak."]
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (a, bx), (c, d) = axes
    for sp, r in f["splits"].items():
        cum = np.array([np.cumsum(s["mean_reward_per_round"]) * len(s["per_node_cumulative_reward"]) for s in r["per_seed"]])
        x = np.arange(1, cum.shape[1] + 1)
        line, = a.plot(x, cum.mean(0), label=f"I/J={sp}")
        a.fill_between(x, cum.mean(0) - cum.std(0), cum.mean(0) + cum.std(0), color=line.get_color(), alpha=0.2)
        curve = np.array(r["mean_reward_per_round"])
        bx.plot(*_sx(curve), color=line.get_color(), label=f"I/J={sp}")
        for node in f["runs_raw"][f"{sp}/seed{rec['config']['seeds'][0]}"]["nodes"].values():
            rw = np.array(node["reward"])
            c.plot(*_sx(rw), color=line.get_color(), lw=0.7, alpha=0.6)
        d.plot(*_sx(np.mean([s["local_mixed_share_per_round"] for s in r["per_seed"]], 0)),
               color=line.get_color(), label=f"{sp} local mixed")
        if r["per_seed"][0]["external_signal_share_per_round"]:
            d.plot(*_sx(np.mean([s["external_signal_share_per_round"] for s in r["per_seed"]], 0)),
                   color=line.get_color(), ls="--", label=f"{sp} external with signal")
        if "reward_minus_8_0_per_round" in r:
            diff = np.array(r["reward_minus_8_0_per_round"])
            bx.plot(*_sx(diff), color=line.get_color(), ls=":", label=f"{sp} minus 8/0")
    bx.axhline(0, color="k", lw=0.6)
    a.set(xlabel="round", ylabel="swarm cumulative reward (mean ± std over seeds)", title="cumulative reward")
    bx.set(xlabel="round", ylabel=f"mean reward per node ({SMOOTH}-round avg)", title="reward per round (dotted: minus 8/0)")
    c.set(xlabel="round", ylabel=f"reward ({SMOOTH}-round avg)", title=f"per-node reward, seed {rec['config']['seeds'][0]}")
    d.set(xlabel="round", ylabel=f"share of groups ({SMOOTH}-round avg)", title="groups with mixed rewards (GRPO signal)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in (a, bx, d):
        ax.legend(fontsize=7)
    ratio = f.get("ratio_4_4")
    fig.suptitle(f"SAPO swarm, {rec['config']['bench']['nodes']} nodes, {len(rec['config']['seeds'])} seeds"
                 + (f": 4/4 = {fmt(ratio, 2)}x 8/0" if ratio else "") + f" @ {rec['git_sha'][:10]}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
