"""sapo_swarm: the SAPO paper's I/J comparison (4/4 vs 8/0 cumulative reward) at tiny CPU scale, over seeds.

One SFT warm start (cached under .cache/ by its settings, never committed), then, for each I/J
split and seed, a collective swarm of N nodes started by the ordinary recipe
(`python -m recipes.rl`), all from that checkpoint, for the same number of rounds. Seeds change
the RL run (question draws, sampling, node seeds), not the warm start. A node's reward per round
is the mean verifier reward of its own G completions; its cumulative reward is the sum over
rounds; a run's figure is the sum over its nodes.

Primary figures (they measure learning): the nodes' own-rollout reward, and held-out greedy
accuracy, the mean of the last 3 evaluations after the start (every task, and per task where the
run logged them), its gain over the start, and 4/4's gain over 8/0's, paired by seed; target
(issue 18): 4/4's held-out gain >= 1.5x 8/0's.

Secondary: the paper's statistic, the batch-mean cumulative reward (genrl's train/rewards, external
groups included). It rises by selection alone: kept external groups passed the zero-advantage
filter, so they hold a correct answer more often than a node's own. Beside it, what selection
alone gives with no learning, from the run's own per-round data: the batch ratio to 8/0 if the
nodes' own reward stayed at 8/0's, (I + J rho) / (I + J), with rho = the run's reward per
external completion over its reward per own completion. The batch mean is never a match with
the paper: the paper's ratio is the same selection on another policy.

Every knob (lr, task mix, warm start, G, rounds) is the same for every split: only I/J differ.
Diagnostics, per split and over rounds: the share of local groups with mixed rewards (the groups
that carry a GRPO signal), the share of received external groups that carry signal, external
groups used per round, per-node reward curves, and the reward difference 4/4 - 8/0 with the
drawdowns of each smoothed curve (the learning-forgetting oscillation).

Nodes that differ (issue 30): `--warm-start-tasks "A,B;A,C;B,C"` trains one warm start per task subset
(here: each leaves one task of the mix out) and starts node n from subset n % K, so every node has
peers that solve what its own warm start never saw. The held-out gain is then split by (node, task)
pair into tasks the node's warm start trained on and tasks it missed: the gain on missed tasks is
the one sharing can carry, and its 4/4 - 8/0 difference (paired by seed) is the mechanism's figure.
An arm "I/J+is" runs I/J with the off-policy correction of received rollouts (loss.external_is).

The GPU mechanism mode, with a pretrained instruct model (SmolLM2-135M-Instruct, 8 nodes sharing one GPU, 8/0 vs
4/4, specialists, seeds appended to a ledger): benchmarks/sapo_swarm_gpu.py.

Each (split, seed) run is one harness job: its result is cached when it finishes, and the
recipe checkpoints every `checkpoint_every` rounds into a run dir named by the job, so an
interrupted benchmark resumes the unfinished run where it stopped.

    # the paper's table: 8 nodes, 4 splits, 150 rounds, 3 seeds (~10 CPU-h):
    python -m benchmarks.sapo_swarm
    python -m benchmarks.sapo_swarm --rounds 30        # the committed result (90 min on 2 loaded cores)
    python -m benchmarks.sapo_swarm --splits 8/0,4/4   # the headline pair only
    python -m benchmarks.sapo_swarm --nodes 2 --rounds 3 --sft-steps 20 --seeds 1 --allow-dirty   # smoke run
    python -m benchmarks.sapo_swarm --regenerate       # re-analyse the committed JSON's per-run data (no runs)
    python -m benchmarks.sapo_swarm --name sapo_swarm_specialists --rounds 100 --splits 8/0,6/2,4/4,4/4+is,2/6 \
        --warm-start-tasks "chain_sum,leg_counting;basic_arithmetic,leg_counting;basic_arithmetic,chain_sum"
        # nodes that differ: the committed run (15 runs of ~9.5 min on 2 quiet cores, + 3 SFT warm starts)
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, round_rows, run_module
from benchmarks.harness import (
    RESULTS,
    Harness,
    config_key,
    config_parser,
    fmt,
    header,
    mean_std,
    parse_config,
    reanalyse,
    save_figure,
)

PAPER = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}
TARGET = 1.5
SMOOTH = 20
# rounds in the moving averages of curves and drawdowns


@dataclass
class BenchConfig:
    # The paper's table: 8 nodes, splits 8/0, 6/2, 4/4, 2/6. A node's round costs ~1-2 CPU-s here
    # (generate 8x8 completions, one step), so the full table (8 nodes x 4 splits x 3 seeds) is
    # ~10 CPU-h; runs on 2 shared cores pass --nodes/--splits/--rounds/--seeds and name it.
    nodes: int = 8
    rounds: int = 150
    splits: str = "8/0,6/2,4/4,2/6"  # arms; "I/J+is" is I/J with the off-policy correction loss.external_is
    # Both arms alike: the single-node learning setup of conf/sapo/learn_cpu.yaml (T=1,
    # top-k off, exact-match reward, lr inside the stable range; benchmarks/sapo_learning.py gates it).
    lr: float = 3e-4
    temperature: float = 1.0
    max_new_tokens: int = 8
    task: str = "sapo_mix"  # conf/task/<task>.yaml the warm start is trained on
    # conf/task/<rl_task>.yaml the RL runs draw from (three vetted tasks, each node its own seeded stream)
    rl_task: str = "sapo_learn"
    sft_steps: int = 250
    sft_lr: float = 2e-3
    sft_seed: int = 0
    eval_prompts: int = 32  # per task, for the warm start's accuracy (G completions each)
    heldout_every: int = 25  # rounds between held-out greedy evaluations on every node
    heldout_prompts: int = 64  # per task
    checkpoint_every: int = 25
    # Nodes that differ (issue 30): ';'-separated task subsets, node n warm-started on subset n % K (each
    # subset its own SFT run), so a node's peers solve what it rarely does; empty: one warm start on `task`.
    warm_start_tasks: str = ""
    cache_dir: str = ".cache"  # SFT warm starts (git-ignored)
    work_dir: str = "runs/bench/sapo_swarm"  # RL run dirs (git-ignored)


def warm_start_subsets(b: BenchConfig) -> list[list[str] | None]:
    """The task subsets the warm starts train on: [None] (the whole of `task`) unless `warm_start_tasks` names some."""
    return [s.split(",") for s in b.warm_start_tasks.split(";")] if b.warm_start_tasks else [None]


def node_warm_tasks(b: BenchConfig, node: int) -> list[str] | None:
    """The tasks node `node`'s warm start trained on (None: every task of the mix)."""
    subsets = warm_start_subsets(b)
    return subsets[node % len(subsets)]


def parse_arm(arm: str) -> tuple[int, int, bool]:
    """'I/J' or 'I/J+is' -> (I, J, external_is)."""
    split, _, extra = arm.partition("+")
    i, j = (int(x) for x in split.split("/"))
    return i, j, extra == "is"


def sft_overrides(b: BenchConfig, tasks: list[str] | None = None) -> list[str]:
    return [
        f"sft.steps={b.sft_steps}",
        "sft.batch_size=32",
        f"sft.lr={b.sft_lr}",
        f"sft.seed={b.sft_seed}",
        f"sampling.max_new_tokens={b.max_new_tokens}",
        f"eval.prompts_per_task={b.eval_prompts}",
        "eval.num_generations=8",
        f"task={b.task}",
        *(subset_overrides(b.task, tasks) if tasks else []),
    ]


def subset_overrides(task: str, tasks: list[str]) -> list[str]:
    """conf/task/<task>.yaml cut to `tasks`: the task list and the options of the tasks left out (the mix refuses
    those)."""
    import yaml

    mix = yaml.safe_load((ROOT / "conf" / "task" / f"{task}.yaml").read_text())
    unknown = sorted(set(tasks) - set(mix["tasks"]))
    if unknown:
        raise ValueError(f"warm_start_tasks: {unknown} not in conf/task/{task}.yaml's tasks {mix['tasks']}")
    dropped = [t for t in mix.get("task_kwargs", {}) if t not in tasks]
    return [f"task.tasks=[{','.join(tasks)}]", *(f"~task.task_kwargs.{t}" for t in dropped)]


def warm_start(b: BenchConfig, tasks: list[str] | None = None) -> tuple[Path, dict]:
    """The SFT checkpoint, keyed by its settings: trained once, reused by every later run."""
    overrides = sft_overrides(b, tasks)
    key = hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:10]
    cache = ROOT / b.cache_dir / f"sapo_sft_{key}"
    if not (cache / "sft_eval.json").exists():
        print(f"SFT warm start ({b.sft_steps} steps) -> {cache.relative_to(ROOT)}", flush=True)
        run_module(
            "recipes.sft",
            [*overrides, "sft.threads=1", "logger.progress=false", f"run_dir={cache}", f"out_dir={cache / 'model'}"],
        )
    return cache / "model", json.loads((cache / "sft_eval.json").read_text())


def node_models(model_dirs: list[str], nodes: int) -> list[str]:
    """One `nodes` override giving node n the warm start n % K (where there are K > 1)."""
    if len(model_dirs) < 2:
        return []
    paths = [ROOT / model_dirs[n % len(model_dirs)] for n in range(nodes)]
    entries = [f"{{model:{{pretrained:'{p}',tokenizer:'{p}'}}}}" for p in paths]
    return [f"nodes=[{','.join(entries)}]"]


def rl_overrides(b: BenchConfig, arm: str, seed: int, model_dirs: list[str], run_dir: Path) -> list[str]:
    i, j, external_is = parse_arm(arm)
    return [
        f"sapo=swarm_{i}_{j}",
        f"num_nodes={b.nodes}",
        f"train.rounds={b.rounds}",
        f"train.seed={seed}",
        f"model.pretrained={ROOT / model_dirs[0]}",
        f"model.tokenizer={ROOT / model_dirs[0]}",
        *node_models(model_dirs, b.nodes),
        *(["loss.external_is=true"] if external_is else []),
        f"optim.lr={b.lr}",
        f"sampling.max_new_tokens={b.max_new_tokens}",
        f"sampling.temperature={b.temperature}",
        "sampling.top_k=null",
        "reward.kind=exact",
        "train.micro_batch_size=64",
        "train.threads=1",
        f"eval.every={b.heldout_every}",
        f"eval.prompts_per_task={b.heldout_prompts}",
        f"train.checkpoint_every={b.checkpoint_every}",
        "train.keep_checkpoints=1",
        "logger.progress=false",
        f"run_dir={run_dir}",
        "resume=true",
        f"task={b.rl_task}",
    ]


def run_job(job: dict) -> dict:
    """One swarm run (split, seed) through the recipe; returns per-node per-round series."""
    b = BenchConfig(**job["bench"])
    arm = job["split"].replace("/", "_").replace("+", "_")
    run_dir = ROOT / b.work_dir / f"{arm}_seed{job['seed']}_{config_key(job)[:8]}"
    model_dirs = job.get("model_dirs") or [job["model_dir"]]
    wall = run_module("recipes.rl", rl_overrides(b, job["split"], job["seed"], model_dirs, run_dir))
    nodes = {}
    for n in range(b.nodes):
        all_rows = round_rows(run_dir / f"node{n}" / "metrics.jsonl")
        rows = [r for r in all_rows if int(r["step"]) >= 1]  # step 0: the starting policy's held-out eval
        if len(rows) != b.rounds:
            raise RuntimeError(f"node{n} logged {len(rows)} rounds, expected {b.rounds}")
        col = lambda k, d=0.0: [round(float(r.get(k, d)), 5) for r in rows]  # noqa: E731
        nodes[f"node{n}"] = {
            "reward": col("reward"),
            "batch_reward": col("batch_reward"),  # genrl's train/rewards: mean over the training batch
            "heldout": {int(r["step"]): r["heldout_greedy/mean"] for r in all_rows if "heldout_greedy/mean" in r},
            "heldout_tasks": {
                int(r["step"]): {
                    k.split("/", 1)[1]: v
                    for k, v in r.items()
                    if k.startswith("heldout_greedy/") and k != "heldout_greedy/mean"
                }
                for r in all_rows
                if "heldout_greedy/mean" in r
            },
            "local_groups": col("local_groups"),
            "local_mixed_groups": col("local_mixed_groups"),
            "external_received": col("external_received"),
            "external_equal_rewards": col("external_equal_rewards"),
            "external_unscorable": col("external_unscorable"),
            "external_groups": col("external_groups"),
            "trained_completions": col("trained_completions"),
            "accuracy": [
                round(float(np.mean([v for k, v in r.items() if k.startswith("accuracy/")])), 5) for r in rows
            ],
            "payloads_dropped": rows[-1].get("payloads_dropped", 0),
            "time_s": {
                k: float(np.mean([r[f"time_{k}"] for r in rows])) for k in ("generate", "exchange", "train", "round")
            },
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
    return {
        "max_drawdown": float((peak - s).max()),
        "total_fall": float(falls.sum()),
        "total_rise": float(np.clip(np.diff(s), 0, None).sum()),
    }


LAST_EVALS = 3  # held-out accuracy: the mean of the last 3 evaluations after the start


def last_evals_mean(curve: dict, steps: list[int], k: int = LAST_EVALS) -> float:
    """Mean of a node's held-out accuracy at the last k evaluation steps after the start (step 0)."""
    after = [s for s in steps if s > 0][-k:] or steps[-1:]
    return float(np.mean([curve.get(s, curve.get(str(s))) for s in after]))


def external_reward_rate(nodes: dict) -> float | None:
    """Reward per external completion the nodes trained on, pooled over rounds and nodes.

    A round's batch mean covers L own groups (the reward the node logs for them) and E external ones,
    all of G completions: batch x (L + E) = own x L + external x E."""
    num, den = 0.0, 0.0
    for v in nodes.values():
        for batch, own, n_own, n_ext in zip(v["batch_reward"], v["reward"], v["local_groups"], v["external_groups"]):
            if n_ext > 0:
                num += batch * (n_own + n_ext) - own * n_own
                den += n_ext
    return num / den if den else None


def selection_only_ratio(i: int, j: int, own_rate: float, external_rate: float | None) -> float:
    """Batch-mean ratio to 8/0 with no learning: own reward at 8/0's, external groups at rho x it."""
    rho = external_rate / own_rate if external_rate is not None and own_rate > 0 else 1.0
    return (i + j * rho) / (i + j)


def gain_by_warm_start(nodes: dict, steps: list[int], warm_tasks: list[list[str] | None]) -> dict:
    """Held-out gain (last-3 mean minus start) per (node, task) pair, pooled by whether the node's warm start
    trained on the task ('trained') or not ('missing': what only its peers' rollouts can teach it), and per task."""
    pools: dict[str, list[float]] = {"trained": [], "missing": [], "start_trained": [], "start_missing": []}
    per_task: dict[str, dict[str, list[float]]] = {}
    for v, warm in zip(nodes.values(), warm_tasks):
        for t in next(iter(v["heldout_tasks"].values())):
            curve = {int(k): x[t] for k, x in v["heldout_tasks"].items()}
            kind = "missing" if warm is not None and t not in warm else "trained"
            gain = last_evals_mean(curve, steps) - curve[steps[0]]
            pools[kind].append(gain)
            pools[f"start_{kind}"].append(curve[steps[0]])
            per_task.setdefault(t, {"trained": [], "missing": []})[kind].append(gain)
    mean = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
    return {
        **{k: mean(xs) for k, xs in pools.items()},
        "per_task": {t: {k: mean(xs) for k, xs in d.items()} for t, d in per_task.items()},
    }


def summarize_run(run: dict, num_external: int, warm_tasks: list[list[str] | None] | None = None) -> dict:
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
    # [nodes, evals]
    heldout = np.array([[v["heldout"].get(k, v["heldout"].get(str(k))) for k in steps] for v in nodes.values()])
    last = np.array([last_evals_mean(v["heldout"], steps) for v in nodes.values()])
    tasks = {}
    if all(v.get("heldout_tasks") for v in nodes.values()):
        names = sorted(next(iter(next(iter(nodes.values()))["heldout_tasks"].values())))
        for t in names:
            curves = [{int(k): x[t] for k, x in v["heldout_tasks"].items()} for v in nodes.values()]
            tasks[t] = {
                "start": float(np.mean([c[steps[0]] for c in curves])),
                "last3": float(np.mean([last_evals_mean(c, steps) for c in curves])),
            }
            tasks[t]["gain"] = tasks[t]["last3"] - tasks[t]["start"]
    ext_rate = external_reward_rate(nodes) if num_external else None
    by_warm = gain_by_warm_start(nodes, steps, warm_tasks or [None] * len(nodes)) if tasks else None
    return {
        "heldout_gain_by_warm_start": by_warm,  # and its two pools, as `paired` reads them:
        "heldout_missing_gain": by_warm and by_warm["missing"],
        "heldout_trained_gain": by_warm and by_warm["trained"],
        "own_reward_rate": float(reward.mean()),
        "external_reward_rate": ext_rate,
        "heldout_last3": float(last.mean()),
        "heldout_last3_gain": float((last - heldout[:, 0]).mean()),
        "heldout_last3_steps": [s for s in steps if s > 0][-LAST_EVALS:],
        "heldout_tasks": tasks,
        "batch_cumulative_reward": float(batch.sum()),  # the paper's statistic (genrl's train/rewards, summed)
        "heldout_steps": steps,
        "heldout_per_eval": heldout.mean(0).round(4).tolist(),
        "heldout_start": float(heldout[:, 0].mean()),
        "heldout_final": float(heldout[:, -1].mean()),
        "heldout_gain": float((heldout[:, -1] - heldout[:, 0]).mean()),
        "swarm_cumulative_reward": float(reward.sum()),
        "per_node_cumulative_reward": reward.sum(1).tolist(),
        "mean_reward_per_round": curve.round(5).tolist(),
        "local_mixed_share": float(mixed.sum() / max(local.sum(), 1)),
        "local_mixed_share_per_round": (mixed.sum(0) / np.maximum(local.sum(0), 1)).round(4).tolist(),
        "external_signal_share": float((scorable - equal).sum() / scorable.sum()) if scorable.sum() else None,
        "external_signal_share_per_round": ((scorable - equal).sum(0) / np.maximum(scorable.sum(0), 1))
        .round(4)
        .tolist()
        if scorable.sum()
        else None,
        "external_used_per_round": float(used.mean()),
        "signal_groups_per_round": float((mixed + used).mean()),  # groups with non-zero advantage in a node's batch
        "accuracy_first_5": float(np.mean([v["accuracy"][:5] for v in nodes.values()]))
        if all(v.get("accuracy") for v in nodes.values())
        else None,
        "local_mixed_share_first_5": float(mixed[:, :5].sum() / max(local[:, :5].sum(), 1)),
        "reward_first_10": float(reward[:, :10].mean()),
        "reward_last_10pct": float(reward[:, -max(1, reward.shape[1] // 10) :].mean()),
        "drawdowns": drawdowns(curve),
        "per_node_drawdowns": [drawdowns(r)["max_drawdown"] for r in reward],
        "mean_round_time_s": {
            k: float(np.mean([v["time_s"][k] for v in nodes.values()]))
            for k in ("generate", "exchange", "train", "round")
        },
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
    warm = [node_warm_tasks(b, n) for n in range(b.nodes)]
    per = {sp: [summarize_run(runs[sp, s], parse_arm(sp)[1], warm) for s in seeds] for sp in splits}
    differ = bool(b.warm_start_tasks)  # nodes from different warm starts: gains split by trained / missing task
    out: dict = {"splits": {}}
    for sp in splits:
        rs = per[sp]
        i, j, _ = parse_arm(sp)
        out["splits"][sp] = {
            **(
                {
                    "heldout_missing_gain": mean_std([r["heldout_missing_gain"] for r in rs]),
                    "heldout_missing_start": mean_std([r["heldout_gain_by_warm_start"]["start_missing"] for r in rs]),
                    "heldout_trained_start": mean_std([r["heldout_gain_by_warm_start"]["start_trained"] for r in rs]),
                    "heldout_trained_gain": mean_std([r["heldout_trained_gain"] for r in rs]),
                    "heldout_gain_per_task_by_warm_start": {
                        t: {
                            k: mean_std([r["heldout_gain_by_warm_start"]["per_task"][t][k] for r in rs])
                            for k in ("trained", "missing")
                            if rs[0]["heldout_gain_by_warm_start"]["per_task"][t][k] is not None
                        }
                        for t in rs[0]["heldout_gain_by_warm_start"]["per_task"]
                    },
                }
                if differ
                else {}
            ),
            "own_reward_rate": mean_std([r["own_reward_rate"] for r in rs]),
            "heldout_last3": mean_std([r["heldout_last3"] for r in rs]),
            "heldout_last3_gain": mean_std([r["heldout_last3_gain"] for r in rs]),
            "heldout_last3_steps": rs[0]["heldout_last3_steps"],
            "heldout_tasks": {
                t: {k: mean_std([r["heldout_tasks"][t][k] for r in rs]) for k in ("start", "last3", "gain")}
                for t in rs[0]["heldout_tasks"]
            }
            if all(r["heldout_tasks"] for r in rs)
            else {},
            "external_reward_rate": mean_std([r["external_reward_rate"] for r in rs]) if j else None,
            "selection_only_batch_ratio": mean_std(
                [selection_only_ratio(i, j, r["own_reward_rate"], r["external_reward_rate"]) for r in rs]
            ),
            "batch_cumulative_reward": mean_std([r["batch_cumulative_reward"] for r in rs]),
            "heldout_start": mean_std([r["heldout_start"] for r in rs]),
            "heldout_final": mean_std([r["heldout_final"] for r in rs]),
            "heldout_gain": mean_std([r["heldout_gain"] for r in rs]),
            "heldout_per_eval": np.mean([r["heldout_per_eval"] for r in rs], 0).round(4).tolist(),
            "heldout_steps": rs[0]["heldout_steps"],
            "swarm_cumulative_reward": mean_std([r["swarm_cumulative_reward"] for r in rs]),
            "mean_cumulative_reward_per_node": mean_std([r["swarm_cumulative_reward"] / b.nodes for r in rs]),
            "local_mixed_share": mean_std([r["local_mixed_share"] for r in rs]),
            "external_signal_share": mean_std([r["external_signal_share"] for r in rs])
            if rs[0]["external_signal_share"] is not None
            else None,
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
                [r["batch_cumulative_reward"] / base["batch_cumulative_reward"] for r, base in zip(rs, per["8/0"])]
            )
            # Held-out gain (mean of the last 3 evaluations minus the start) over 8/0's: a ratio of means
            # (a per-seed ratio of small gains is unstable).
            base_gain = np.mean([base["heldout_last3_gain"] for base in per["8/0"]])
            out["splits"][sp]["heldout_gain_ratio_to_8_0"] = (
                float(np.mean([r["heldout_last3_gain"] for r in rs]) / base_gain) if base_gain else None
            )
            out["splits"][sp]["paired_vs_8_0"] = {
                k: paired(rs, per["8/0"], k)
                for k in (
                    "heldout_last3_gain",
                    "swarm_cumulative_reward",
                    "batch_cumulative_reward",
                    *(("heldout_missing_gain", "heldout_trained_gain") if differ else ()),
                )
            }
            diff = np.mean(
                [
                    np.array(r["mean_reward_per_round"]) - np.array(base["mean_reward_per_round"])
                    for r, base in zip(rs, per["8/0"])
                ],
                0,
            )
            out["splits"][sp]["reward_minus_8_0_per_round"] = diff.round(5).tolist()
    firsts = [r for sp in splits for r in per[sp]]
    out["rl_start"] = {  # the first 5 rounds of every run, at the RL sampling temperature
        "accuracy": mean_std([r["accuracy_first_5"] for r in firsts])
        if all(r["accuracy_first_5"] is not None for r in firsts)
        else None,
        "local_mixed_share": mean_std([r["local_mixed_share_first_5"] for r in firsts]),
    }
    if "4/4" in out["splits"] and "ratio_to_8_0" in out["splits"]["4/4"]:
        out["ratio_4_4"] = out["splits"]["4/4"]["ratio_to_8_0"]
        out["batch_ratio_4_4"] = out["splits"]["4/4"]["batch_ratio_to_8_0"]
        out["heldout_gain_ratio_4_4"] = out["splits"]["4/4"]["heldout_gain_ratio_to_8_0"]
        out["selection_only_batch_ratio_4_4"] = out["splits"]["4/4"]["selection_only_batch_ratio"]
        # Issue 18's target: 4/4's held-out accuracy gain (last-3 mean minus start) >= 1.5x 8/0's.
        out["target_met"] = out["heldout_gain_ratio_4_4"] is not None and out["heldout_gain_ratio_4_4"] >= TARGET
        out["target_met_by_arm"] = {
            sp: r["heldout_gain_ratio_to_8_0"] is not None and r["heldout_gain_ratio_to_8_0"] >= TARGET
            for sp, r in out["splits"].items()
            if parse_arm(sp)[:2] == (4, 4)
        }
    return out


def main() -> None:
    ap = config_parser(BenchConfig, __doc__, smoke={"nodes": 2, "rounds": 3, "sft_steps": 20, "seeds": 1})
    ap.add_argument(
        "--regenerate",
        action="store_true",
        help="re-analyse benchmarks/results/<name>.json's per-run data (runs_raw) with this code; runs nothing",
    )
    ap.add_argument("--name", default="sapo_swarm", help="results file name under benchmarks/results/")
    b, nseeds, allow_dirty, fresh, regen, name, smoke = parse_config(ap, BenchConfig, "regenerate", "name", "smoke")
    if regen:
        print(regenerate(RESULTS / f"{name}.json", allow_dirty)["txt"].read_text())
        return
    seeds = list(range(nseeds))
    splits = b.splits.split(",")
    subsets = warm_start_subsets(b)
    hz = Harness(
        name,
        __file__,
        {
            "bench": asdict(b),
            "seeds": seeds,
            "sft_overrides": [sft_overrides(b, t) for t in subsets],
            "rl_overrides_example": rl_overrides(
                b, splits[-1], 0, [f"<sft model {k}>" for k in range(len(subsets))], Path("<run dir>")
            ),
        },
        allow_dirty=allow_dirty,
        fresh=fresh,
        smoke=smoke,
    )
    t0 = time.perf_counter()
    starts = [warm_start(b, tasks) for tasks in subsets]
    sft_wall = time.perf_counter() - t0
    model_rels = [m.relative_to(ROOT).as_posix() for m, _ in starts]
    where = {"model_dir": model_rels[0]} if len(model_rels) == 1 else {"model_dirs": model_rels}
    # Seeds outer, splits inner: an interrupted benchmark has complete paired seeds. A job's config names its own
    # arm only, so a later invocation with more arms reuses the cached runs of the arms it shares.
    jobs = [{"bench": {**asdict(b), "splits": sp}, "split": sp, "seed": s, **where} for s in seeds for sp in splits]
    results = hz.run_jobs(jobs, run_job, desc=f"sapo swarm ({b.nodes} nodes x {b.rounds} rounds)")
    runs = {(j["split"], j["seed"]): r for j, r in zip(jobs, results)}
    figures = {
        "sft": {**sft_figures(starts[0][1]), "wall_s_this_invocation": sft_wall},
        **analyze(b, seeds, runs),
        "warm_starts": [{"tasks": tasks, **sft_figures(sft)} for tasks, (_, sft) in zip(subsets, starts)],
        "paper_cumulative_reward": PAPER,
        "target": TARGET_TEXT,
        "runs_raw": {f"{sp}/seed{s}": runs[sp, s] for s in seeds for sp in splits},
    }
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


TARGET_TEXT = f"4/4's held-out gain (last-3 mean minus start) >= {TARGET}x 8/0's (ratio of means over seeds)"


def sft_figures(sft: dict) -> dict:
    acc = sft["accuracy"]
    prompts = sum(a["prompts"] for a in acc.values())
    return {
        **sft,
        "start_sampled_accuracy": float(np.mean([a["sampled_accuracy"] for a in acc.values()])),
        "start_mixed_share_g8": sum(a["mixed_groups"] for a in acc.values()) / prompts,
    }


def regenerate(path: Path, allow_dirty: bool = False) -> dict[str, Path]:
    """Re-analyse a committed result from its own per-run data (runs_raw); the runs' provenance is kept."""

    def figures(rec: dict) -> dict:
        b, seeds, raw = BenchConfig(**rec["config"]["bench"]), rec["config"]["seeds"], rec["figures"]["runs_raw"]
        runs = {(sp, s): raw[f"{sp}/seed{s}"] for s in seeds for sp in b.splits.split(",")}
        sft = {
            k: v
            for k, v in rec["figures"]["sft"].items()
            if k not in ("start_sampled_accuracy", "start_mixed_share_g8")
        }
        starts = {"warm_starts": rec["figures"]["warm_starts"]} if "warm_starts" in rec["figures"] else {}
        return {
            "sft": sft_figures(sft),
            **starts,
            **analyze(b, seeds, runs),
            "paper_cumulative_reward": PAPER,
            "target": TARGET_TEXT,
            "runs_raw": raw,
        }

    return reanalyse(path, figures, text, plot, allow_dirty)


def _x(ms: dict | None, digits: int = 2) -> str:
    return "1" if ms is None else f"{fmt(ms, digits)}x"


def _p(v: dict) -> str:
    return f", paired t={v['t']:.2f} p={v['p']:.3f}" if "t" in v else ""


def text(rec: dict) -> str:
    f, b = rec["figures"], rec["config"]["bench"]
    starts = f.get("warm_starts") or [{"tasks": None, **f["sft"]}]
    sp0 = next(iter(f["splits"].values()))
    last = sp0.get("heldout_last3_steps", [])
    lines = [header(rec)]
    if rec.get("analysis_git_sha"):
        lines.append(
            f"figures re-analysed from the committed per-run data at {rec['analysis_git_sha'][:12]} (runs made at "
            f"{rec['git_sha'][:12]})"
        )
    lines += [
        "",
        f"{b['nodes']} nodes x {b['rounds']} rounds, G=8, RL task mix conf/task/{b.get('rl_task', b['task'])}.yaml "
        f"(warm start on conf/task/{b['task']}.yaml), exact-match reward, T={b['temperature']}, "
        f"top-k off, RL lr {b['lr']}, max_new_tokens {b['max_new_tokens']}, seeds {rec['config']['seeds']}",
        *[
            warm_start_line(w, list(range(k, b["nodes"], len(starts))) if len(starts) > 1 else None)
            for k, w in enumerate(starts)
        ],
        departures(b),
        f"RL start (first 5 rounds of every run, T={b['temperature']}): exact accuracy "
        + (fmt(f["rl_start"]["accuracy"], 3) if f["rl_start"]["accuracy"] else "-")
        + f", share of local groups with mixed rewards {fmt(f['rl_start']['local_mixed_share'], 3)}",
        "",
        "PRIMARY (learning): the nodes' own-rollout reward and held-out greedy accuracy (mean over nodes; 'last "
        f"3' = the mean of the last {LAST_EVALS} evaluations after the start, here rounds {last}; every task averaged)",
        "| I/J | own reward per completion | own-rollout cum. reward | ratio to 8/0 | held-out start | held-out "
        "last 3 | gain | gain / 8/0's | gain minus 8/0's (paired) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for sp, r in f["splits"].items():
        gr = r.get("heldout_gain_ratio_to_8_0")
        pv = r.get("paired_vs_8_0", {}).get("heldout_last3_gain")
        lines.append(
            f"| {sp} | {fmt(r['own_reward_rate'], 3)} | {fmt(r['swarm_cumulative_reward'], 1)} | "
            f"{_x(r.get('ratio_to_8_0'))} | {r['heldout_start']['mean']:.3f} | {fmt(r['heldout_last3'], 3)} | "
            f"{fmt(r['heldout_last3_gain'], 3)} | "
            f"{'1' if sp == '8/0' else f'{gr:.2f}x' if gr is not None else 'n/a (8/0 gain 0)'} | "
            f"{'-' if pv is None else fmt(pv['diff'], 3) + _p(pv)} |"
        )
    tasks = sp0.get("heldout_tasks") or {}
    if tasks:
        lines += ["", "held-out per task (start -> last 3, gain):"]
        for sp, r in f["splits"].items():
            lines.append(
                f"  {sp}: "
                + "; ".join(
                    f"{t} {v['start']['mean']:.3f} -> {v['last3']['mean']:.3f} ({v['gain']['mean']:+.3f})"
                    for t, v in r["heldout_tasks"].items()
                )
            )
    else:
        lines += [
            "",
            "held-out per task: not in this run's data (the runs logged the mean over tasks only); later runs "
            "record each task",
        ]
    if "heldout_missing_gain" in sp0:
        lines += [
            "",
            "held-out gain by the node's warm start (mean over (node, task) pairs): 'missing' = tasks the node's "
            "warm start never trained on (only peers' rollouts carry them), 'trained' = the rest",
            "| I/J | start, missing | gain, missing tasks | minus 8/0's (paired) | start, trained | gain, trained "
            "tasks | minus 8/0's (paired) |",
            "|---|---|---|---|---|---|---|",
        ]
        for sp, r in f["splits"].items():
            pv = r.get("paired_vs_8_0", {})
            cell = lambda k: "-" if k not in pv else fmt(pv[k]["diff"], 3) + _p(pv[k])  # noqa: E731
            lines.append(
                f"| {sp} | {fmt(r['heldout_missing_start'], 3)} | {fmt(r['heldout_missing_gain'], 3)} | "
                f"{cell('heldout_missing_gain')} | {fmt(r['heldout_trained_start'], 3)} | "
                f"{fmt(r['heldout_trained_gain'], 3)} | {cell('heldout_trained_gain')} |"
            )
        lines.append("per task, gain on nodes whose warm start missed it / trained on it:")
        for sp, r in f["splits"].items():
            lines.append(
                f"  {sp}: "
                + "; ".join(
                    f"{t} " + " / ".join(f"{v[k]['mean']:+.3f}" if k in v else "-" for k in ("missing", "trained"))
                    for t, v in r["heldout_gain_per_task_by_warm_start"].items()
                )
            )
    for sp, r in f["splits"].items():
        if "paired_vs_8_0" in r:
            v = r["paired_vs_8_0"]["swarm_cumulative_reward"]
            lines.append(f"{sp} minus 8/0, own-rollout cum. reward per seed (n={v['n']}): {fmt(v['diff'], 2)}{_p(v)}")
    lines += [
        "",
        "SECONDARY (selection, not learning): the batch-mean cumulative reward (genrl's train/rewards: mean over the "
        "training batch, external groups included, summed over rounds and nodes) beside what selection alone gives "
        "with no learning, (I + J rho) / (I + J), rho = this run's reward per external completion / per own "
        "completion. Not a match with the paper: the paper's ratio carries the same selection.",
        "| I/J | batch-mean cum. reward | batch ratio to 8/0 | no-learning (selection-only) ratio | own reward per "
        "completion | external reward per completion | paper's batch ratio (for reference) |",
        "|---|---|---|---|---|---|---|",
    ]
    for sp, r in f["splits"].items():
        paper = f"{PAPER[sp] / PAPER['8/0']:.2f}x" if sp in PAPER else "-"
        ext = fmt(r["external_reward_rate"], 3) if r.get("external_reward_rate") else "-"
        lines.append(
            f"| {sp} | {fmt(r['batch_cumulative_reward'], 1)} | {_x(r.get('batch_ratio_to_8_0'))} | "
            f"{fmt(r['selection_only_batch_ratio'], 2)}x | {fmt(r['own_reward_rate'], 3)} | {ext} | {paper} |"
        )
    lines += [
        "",
        "diagnostics:",
        "| I/J | local mixed | ext. signal | ext. used/round | own reward first 10 -> last 10% | max drawdown | "
        "round s |",
        "|---|---|---|---|---|---|---|",
    ]
    for sp, r in f["splits"].items():
        ext = fmt(r["external_signal_share"], 2) if r["external_signal_share"] else "-"
        t = np.mean([s["mean_round_time_s"]["round"] for s in r["per_seed"]])
        lines.append(
            f"| {sp} | {fmt(r['local_mixed_share'], 2)} | {ext} | {fmt(r['external_used_per_round'], 2)} | "
            f"{r['reward_first_10']['mean']:.3f} -> {r['reward_last_10pct']['mean']:.3f} | "
            f"{fmt(r['max_drawdown'], 3)} | {t:.2f} |"
        )
    if "ratio_4_4" in f:
        g = f["heldout_gain_ratio_4_4"]
        lines += [
            "",
            f"target: {f.get('target', TARGET_TEXT)}: {('%.2fx' % g) if g is not None else 'n/a'} -> "
            f"{'MET' if f['target_met'] else 'NOT MET'}; own-rollout ratio 4/4 / 8/0 {fmt(f['ratio_4_4'], 2)}x; "
            f"batch-mean ratio {fmt(f['batch_ratio_4_4'], 2)}x against {fmt(f['selection_only_batch_ratio_4_4'], 2)}x "
            "from selection alone",
        ]
        for sp, met in f.get("target_met_by_arm", {}).items():
            if sp != "4/4":
                ratio = f["splits"][sp]["heldout_gain_ratio_to_8_0"]
                lines.append(f"  {sp}: {'n/a' if ratio is None else f'{ratio:.2f}x'} -> {'MET' if met else 'NOT MET'}")
    n = len(rec["config"]["seeds"])
    lines += [
        f"detectable with n={n} seeds (paired t, 5%, two-sided): a held-out gain difference above t(0.975, n-1) x "
        "its std / sqrt(n) = "
        + ", ".join(
            f"{sp} {_detectable(r['paired_vs_8_0']['heldout_last3_gain']['diff']):.3f}"
            for sp, r in f["splits"].items()
            if "paired_vs_8_0" in r
        ),
        "local mixed = share of a node's own groups with non-equal rewards; ext. signal = share of received peer "
        "groups with non-equal rewards (the ones J draws from); max drawdown = largest fall of the "
        f"{SMOOTH}-round moving average of own reward from its running peak.",
    ]
    return "\n".join(lines)


def departures(b: dict) -> str:
    """What this run does not match of the paper's protocol, named."""
    missing = [sp for sp in PAPER if sp not in b["splits"].split(",")]
    return (
        "departures from the paper's protocol: ~1.9M-param byte-level model (paper Qwen2.5-0.5B), 3 easy tasks "
        f"(paper 9), {b['rounds']} rounds, "
        + ("" if b["nodes"] == 8 else f"{b['nodes']} nodes (paper 8), ")
        + f"lr {b['lr']} from the single-node setup "
        "(conf/sapo/learn_cpu.yaml), not tuned per arm"
        + (
            ", warm starts that differ by task subset (the paper's nodes share one model; here peers hold what a node "
            "lacks, as issue 30 asks)"
            if b.get("warm_start_tasks")
            else ""
        )
        + (f", splits {', '.join(missing)} not run" if missing else "")
    )


def warm_start_line(w: dict, nodes: list[int] | None) -> str:
    """One warm start: its tasks, the nodes that start from it, its SFT steps and sampled accuracy."""
    where = ("" if w["tasks"] is None else " on " + "+".join(w["tasks"])) + (
        "" if nodes is None else f" (nodes {nodes})"
    )
    return (
        f"warm start{where}: {w['steps']} SFT steps; sampled accuracy "
        + ", ".join(f"{t} {a['sampled_accuracy']:.1%}" for t, a in w["accuracy"].items())
        + f" (mean {w['start_sampled_accuracy']:.1%}, T=1); prompts with mixed rewards at G=8: "
        f"{w['start_mixed_share_g8']:.1%}"
    )


def _detectable(ms: dict) -> float:
    from scipy.stats import t

    n = ms["n"]
    return float(t.ppf(0.975, n - 1) * ms["std"] / np.sqrt(n)) if n > 1 else float("nan")


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    fig, axes = plt.subplots(2, 3, figsize=(17, 8))
    (a, bx, c), (d, e, g) = axes
    splits = list(f["splits"])
    for sp, r in f["splits"].items():
        cum = np.array(
            [np.cumsum(s["mean_reward_per_round"]) * len(s["per_node_cumulative_reward"]) for s in r["per_seed"]]
        )
        x = np.arange(1, cum.shape[1] + 1)
        (line,) = a.plot(x, cum.mean(0), label=f"I/J={sp}")
        col = line.get_color()
        a.fill_between(x, cum.mean(0) - cum.std(0), cum.mean(0) + cum.std(0), color=col, alpha=0.2)
        bx.plot(*_sx(np.array(r["mean_reward_per_round"])), color=col, label=f"I/J={sp}")
        if "reward_minus_8_0_per_round" in r:
            bx.plot(*_sx(np.array(r["reward_minus_8_0_per_round"])), color=col, ls=":", label=f"{sp} minus 8/0")
        hs = np.array([s["heldout_per_eval"] for s in r["per_seed"]])
        c.errorbar(r["heldout_steps"], hs.mean(0), yerr=hs.std(0), color=col, marker="o", capsize=2, label=f"I/J={sp}")
        e.plot(
            *_sx(np.mean([s["local_mixed_share_per_round"] for s in r["per_seed"]], 0)),
            color=col,
            label=f"{sp} local mixed",
        )
        if r["per_seed"][0]["external_signal_share_per_round"]:
            e.plot(
                *_sx(np.mean([s["external_signal_share_per_round"] for s in r["per_seed"]], 0)),
                color=col,
                ls="--",
                label=f"{sp} external with signal",
            )
        for node in f["runs_raw"][f"{sp}/seed{rec['config']['seeds'][0]}"]["nodes"].values():
            g.plot(*_sx(np.array(node["reward"])), color=col, lw=0.7, alpha=0.6)
    xs = np.arange(len(splits))
    own = [f["splits"][sp].get("ratio_to_8_0") or {"mean": 1.0, "std": 0.0} for sp in splits]
    batch = [f["splits"][sp].get("batch_ratio_to_8_0") or {"mean": 1.0, "std": 0.0} for sp in splits]
    sel = [f["splits"][sp]["selection_only_batch_ratio"] for sp in splits]
    for k, (vals, lab) in enumerate(
        [
            (own, "own-rollout (learning)"),
            (batch, "batch mean (paper's statistic)"),
            (sel, "batch mean, selection alone (no learning)"),
        ]
    ):
        d.bar(
            xs + (k - 1) * 0.27,
            [v["mean"] for v in vals],
            yerr=[v["std"] for v in vals],
            width=0.27,
            capsize=2,
            label=lab,
        )
    d.axhline(1, color="k", lw=0.6)
    d.set_xticks(xs, splits)
    bx.axhline(0, color="k", lw=0.6)
    a.set(
        xlabel="round",
        ylabel="own-rollout cumulative reward (mean ± std over seeds)",
        title="own-rollout cumulative reward",
    )
    bx.set(
        xlabel="round",
        ylabel=f"own reward per node ({SMOOTH}-round avg)",
        title="own reward per round (dotted: minus 8/0)",
    )
    c.set(xlabel="round", ylabel="held-out greedy accuracy", title="held-out accuracy")
    d.set(xlabel="I/J", ylabel="ratio to 8/0", title="ratio to 8/0: learning vs the batch mean vs selection alone")
    e.set(
        xlabel="round", ylabel=f"share of groups ({SMOOTH}-round avg)", title="groups with mixed rewards (GRPO signal)"
    )
    g.set(
        xlabel="round",
        ylabel=f"own reward ({SMOOTH}-round avg)",
        title=f"per-node own reward, seed {rec['config']['seeds'][0]}",
    )
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in (a, bx, c, d, e):
        ax.legend(fontsize=7)
    ratio, gain = f.get("ratio_4_4"), f.get("heldout_gain_ratio_4_4")
    fig.suptitle(
        f"SAPO swarm, {rec['config']['bench']['nodes']} nodes, {len(rec['config']['seeds'])} seeds"
        + (
            f": 4/4 own-rollout = {fmt(ratio, 2)}x 8/0, held-out gain = {gain:.2f}x 8/0's"
            if ratio and gain is not None
            else ""
        )
        + f" @ {rec['git_sha'][:10]}"
    )
    fig.tight_layout()
    save_figure(fig, png, dpi=100)


if __name__ == "__main__":
    main()
