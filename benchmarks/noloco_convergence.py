"""noloco_convergence: NoLoCo at H against DiLoCo at 2H and at H, each tuned under the protocol, DDP as the reference.

Protocol (the NoLoCo paper's released configs run NoLoCo at H=50 against DiLoCo at H=100, heavy-ball
outer momentum on both, DP 4-16 replicas, perplexity averaged over all replicas; the paper reports
NoLoCo up to 4 % faster convergence), on benchmarks/protocol.py (docs/benchmarks.md):
  arms, per N replicas and seed, all at equal tokens and the same inner AdamW schedule:
    noloco_H      NoLoCo, H inner steps, outer lr x momentum tuned
    diloco_2H     DiLoCo, 2H, outer lr x momentum x (Nesterov or heavy ball) tuned
    diloco_H      DiLoCo at NoLoCo's H (equal H: equal sync count), tuned as diloco_2H
    ddp           one gradient all-reduce per step (one replica with the global batch): the quality reference
  0. the inner lr, checked once for all arms: DiLoCo 2H at the paper's point (heavy ball 0.7 / 0.3) over an
     inner-lr ladder on the tuning seeds; every arm trains at the winner;
  1. at the first N, each tuned arm's `grid_search` on tuning seeds 100, 101, chosen on the *validation*
     split (final loss, mean over all replicas): the product of coarse start values, then the winner's
     unrun ladder neighbours until it is bracketed; every point on seed 100, the best `--finalists` on
     both; the runner-up and disagreeing tuning seeds are reported;
  2. evaluation seeds 0..7 (disjoint): every arm at its winner; final *test* loss of every replica,
     averaged (and perplexity exp(loss) averaged over replicas, as the paper), the replicas' averaged model;
  3. the decisions, fixed before the run (`RULES`): "better" when the 95 % interval of the paired final
     test loss difference lies below 0, "worse" above, else "undecided" with the effect the run could
     detect at 80 % power; the same rule for the inner steps each arm needs to reach DiLoCo's best final
     val loss (best of the two DiLoCo arms, per seed) and DiLoCo 2H's own;
  4. secondary: bytes each node uploads and modelled sync seconds on the emulated WAN (alpha-beta fit
     of results/comm_sync.json; pair swap for NoLoCo, ring all-reduce for DiLoCo and DDP).

Steps are set so every run reads >= `--tokens-per-param` (20) tokens per parameter (all replicas' tokens),
rounded up to a multiple of 2H. Compute, measured on this 2-core box (`--model xs`, 49,824 params, N=8,
8 x 4 x 32 = 1024 tokens/step, 976 steps = 20.1 tokens/param): a 96-step run took 45-49 s wall for NoLoCo /
DiLoCo and 11 s for DDP at load 15, i.e. ~60 CPU-s for a whole NoLoCo or DiLoCo run (~15 for DDP). About
20 runs for NoLoCo's grid and ~32 for each DiLoCo arm's (a simulated walk from the coarse start), 3-7
inner-lr runs and 4 arms x 8 eval seeds: ~120 runs, about 2 CPU-hours; `--parallel 2` takes ~1 h on a
quiet box and 2-4 h on the shared one. It resumes from the run cache.

Why in-process replicas: on 2 shared cores one `recipes.train` launch costs ~60 s of start-up before
its first step. Each run is the library's own training (`Trainer` and the algorithm's hooks, the
recipe's model, corpus, sampler, AdamW, clip and schedule) with N replicas as threads of one process
over `core/comm/inprocess_transport.py` (`algorithms/pretraining/inprocess_replicas.py`);
tests/integration/test_transports_agree.py checks that this gives bit-identical weights to a
multi-process gloo run. The curves are the Trainer's own evaluation, logged by every replica.

    nohup python -m benchmarks.noloco_convergence --data pinned --parallel 2 > runs/noloco_convergence.log 2>&1 &
    python -m benchmarks.noloco_convergence --workers 8 16       # and N=16 at N=8's tuned outer optimizers
    python -m benchmarks.noloco_convergence --smoke               # the whole path, N=4 (4.3 min at load 15)
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import (
    CACHE_DIR,
    MODEL_SIZES,
    RESULTS,
    Harness,
    add_corpus_flags,
    bench_parser,
    corpus_facts,
    corpus_of,
    divergence,
    fmt,
    header,
    mean_std,
    model_params,
    model_section,
    parse,
    recipe_sections,
    save_figure,
    seed_list,
    steps_for,
)
from benchmarks.protocol import (
    Axis,
    DecisionRule,
    consistency,
    decide,
    decision,
    describe,
    describe_consistency,
    describe_rules,
    describe_tuning,
    grid_search,
    preregister,
    unmet,
)

# label -> (algorithm, H multiplier); every non-DDP arm is tuned on its own grid
ARMS = {"noloco_H": ("noloco", 1), "diloco_2H": ("diloco", 2), "diloco_H": ("diloco", 1), "ddp": ("ddp", 1)}
TUNED = [a for a, (algo, _) in ARMS.items() if algo != "ddp"]
LR_LADDER = (0.18, 0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)  # the outer optimizers accept (0, 4]
MOM_LADDER = (0.0, 0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
NESTEROV = Axis((False, True), (False, True), ordered=False)
SPACES = {  # coarse start values around the NoLoCo paper's points (NoLoCo 0.7 / 0.5, DiLoCo 0.7 / 0.3)
    "noloco": {"lr": Axis(LR_LADDER, (0.35, 0.7, 1.4)), "momentum": Axis(MOM_LADDER, (0.1, 0.5, 0.9))},
    "diloco": {
        "lr": Axis(LR_LADDER, (0.35, 0.7, 1.4)),
        "momentum": Axis(MOM_LADDER, (0.1, 0.5, 0.9)),
        "nesterov": NESTEROV,
    },
}
INNER_SPACE = {"inner_lr": Axis((7.5e-4, 1.5e-3, 3e-3, 6e-3, 1.2e-2), (1.5e-3, 3e-3, 6e-3))}
INNER_AT = ("diloco_2H", {"lr": 0.7, "momentum": 0.3, "nesterov": False})  # the paper's DiLoCo baseline
RULE = {"noloco": {"name": "noloco"}, "diloco": {"name": "sgd"}}
COMPARISONS = {  # name -> (x, y): x - y paired by seed
    "noloco_H_vs_diloco_2H": ("noloco_H", "diloco_2H"),  # the paper's 1:2 ratio: the headline
    "noloco_H_vs_diloco_H": ("noloco_H", "diloco_H"),  # equal H
    "noloco_H_vs_ddp": ("noloco_H", "ddp"),
    "diloco_2H_vs_ddp": ("diloco_2H", "ddp"),
    "diloco_H_vs_ddp": ("diloco_H", "ddp"),
}
RULES = {name: DecisionRule("better") for name in COMPARISONS}
STEPS_RULE = DecisionRule("better")  # fewer inner steps to the target
_CORPUS: dict[str, Any] = {}


def valid(s: dict[str, Any]) -> bool:
    return not (s.get("nesterov") and s.get("momentum") == 0)  # torch's Nesterov needs momentum


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
    return config_from_dict(
        {
            "algorithm": algorithm,
            "model": {"name": "llama_bench", **model_section(job["model"], job["seq_len"])},
            "data": {**job["data"], "seq_len": job["seq_len"]},
            "optim": {"lr": job["inner_lr"], "warmup_steps": job["warmup"]},
            "train": {
                "steps": steps,
                "global_batch_size": n * job["local_batch"],
                "micro_batch_size": micro,
                "eval_every": job["eval_every"],
                "eval_batches": max(1, job["eval_blocks"] // micro),
                "checkpoint_every": steps,
                "keep_checkpoints": 1,
                "threads": 1,
                "seed": job["seed"],
                "device": "cpu",
                "compile": "none",
            },
            "logger": {"progress": False, "console": False, "log_every": steps, "all_ranks": True},
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )


def _corpus(cfg):
    from dataclasses import asdict

    from decentrain.data.blocks import build_corpus
    from decentrain.models.factory import build_tokenizer

    key = json.dumps(asdict(cfg.data), sort_keys=True, default=str)
    if key not in _CORPUS:
        _CORPUS[key] = build_corpus(cfg.data, build_tokenizer(cfg.model))
    return _CORPUS[key]


def _loss(model, corpus, split: str, n: int) -> tuple[float, float | None]:
    """Mean next-token loss and bits per byte over the domains (None without the tokens' byte lengths)."""
    from decentrain.algorithms.pretraining.trainer import evaluate_bits

    blocks = {d: corpus.split(split, d)[:n] for d in corpus.blocks}
    loss, bpb = evaluate_bits(model, blocks, 8, torch.device("cpu"), token_bytes=corpus.token_bytes)
    return float(sum(loss.values()) / len(blocks)), (float(sum(bpb.values()) / len(blocks)) if bpb else None)


def average_state(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The replicas' averaged model (floating tensors averaged, others taken from the first)."""
    return {
        k: (sum(s[k].double() for s in states) / len(states)).to(v.dtype) if v.is_floating_point() else v
        for k, v in states[0].items()
    }


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """The pointwise mean of val curves (replicas, or seeds; same eval steps on each)."""
    return [{"step": pts[0]["step"], "val_loss": sum(p["val_loss"] for p in pts) / len(pts)} for pts in zip(*curves)]


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One run of the library's own training: `Trainer` + the algorithm's hooks, N replicas as threads
    over the in-process transport (1 replica with the whole global batch for DDP)."""
    import tempfile

    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process
    from decentrain.core.metrics import metrics_file, read_jsonl
    from decentrain.models.factory import build_model, build_tokenizer, num_params

    torch.set_num_threads(1)
    cfg = _train_config(job)
    replicas = 1 if job["algorithm"] == "ddp" else job["workers"]
    with tempfile.TemporaryDirectory(prefix="noloco_convergence_") as run_dir:
        t0 = time.perf_counter()
        try:
            runs = run_replicas_in_process(cfg, replicas, Path(run_dir))
        except RuntimeError as e:  # a diverged grid point loses; anything else stops the benchmark
            if (diverged := divergence(e)) is None:
                raise
            return {
                "diverged": diverged,
                "params": num_params(build_model(cfg.model, build_tokenizer(cfg.model))),
                **dict.fromkeys(
                    (
                        "final_val_loss",
                        "final_test_loss",
                        "final_test_ppl",
                        "final_val_loss_avg_model",
                        "final_test_loss_avg_model",
                        "test_loss_replica_spread",
                    ),
                    math.inf,
                ),
                "val_curve": [],
                "train_s": time.perf_counter() - t0,
                "corpus": None,
            }
        train_s = time.perf_counter() - t0
        curves, corpus_named = [], None
        for r in range(replicas):
            rows = read_jsonl(Path(run_dir) / metrics_file(r))
            curves.append([{"step": x["step"], "val_loss": x["eval/loss"]} for x in rows if "eval/loss" in x])
            corpus_named = corpus_named or corpus_of(rows)
    model = build_model(cfg.model, build_tokenizer(cfg.model))
    corpus, n = _corpus(cfg), job["final_blocks"]
    per, bits = {"val": [], "test": []}, []
    for r in runs:
        model.load_state_dict(r.weights)
        for split in per:
            loss, bpb = _loss(model, corpus, split, n)
            per[split].append(loss)
            if split == "test":
                bits.append(bpb)
    model.load_state_dict(average_state([r.weights for r in runs]))
    avg = {split: _loss(model, corpus, split, n)[0] for split in per}
    return {
        "val_curve": mean_curve(curves),  # all replicas' mean
        "final_val_loss": sum(per["val"]) / len(runs),
        "final_test_loss": sum(per["test"]) / len(runs),
        # the paper's statistic: perplexity of each replica's model, averaged over the replicas
        "final_test_ppl": sum(math.exp(x) for x in per["test"]) / len(runs),
        "final_test_bpb": None if None in bits else sum(bits) / len(runs),  # names the text's unit, not the tokens'
        "final_val_loss_avg_model": avg["val"],
        "final_test_loss_avg_model": avg["test"],
        "test_loss_replica_spread": max(per["test"]) - min(per["test"]),
        "params": num_params(model),
        "train_s": train_s,
        "corpus": corpus_named,
    }


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


def steps_to_best(curves: dict[str, dict], reference: list[str]) -> dict[str, Any]:
    """For one seed: the target is the best (lowest) final val loss of the `reference` arms' curves; each
    arm's interpolated inner steps to reach it (None: never)."""
    target = min(curves[a][-1]["val_loss"] for a in reference)
    return {"target_val_loss": target, "steps": {a: first_step_at(c, target) for a, c in curves.items()}}


# -- communication model (secondary) ----------------------------------------------------
def comm_per_step(algo: str, n: int, h: int, params: int, fits: dict) -> tuple[float, float]:
    """(bytes each node uploads, emulated-WAN seconds) per inner step, fp32 weights."""
    from benchmarks.common import wire

    nbytes = 4 * params
    method, every = {"noloco": ("pair", h), "diloco": ("ring", h), "ddp": ("ring", 1)}[algo]
    messages, sent = wire(method, n, nbytes)
    fit = fits[f"emulated/{method}"]
    return sent / every, (fit["alpha_s"] * messages + sent / fit["beta_bytes_per_s"]) / every


# -- the protocol -----------------------------------------------------------------------
def tune(hz: Harness, make_job, n: int, plan: dict[str, Any]) -> dict[str, Any]:
    """Stages 0 and 1 at N replicas: the inner lr once for all arms, then each tuned arm's grid_search on the
    tuning seeds, every point judged by its final val loss over all replicas."""

    def evaluate(arm: str, inner_lr: float | None):
        def run(cells: list[tuple[dict, int]]) -> list[float]:
            jobs = [
                make_job(arm, {k: v for k, v in s.items() if k != "inner_lr"}, n, seed, s.get("inner_lr", inner_lr))
                for s, seed in cells
            ]
            res = hz.run_jobs(jobs, train_run, desc=f"tune {arm} N={n} (val)", parallel=plan["parallel"])
            return [r["final_val_loss"] for r in res]

        return run

    seeds, kw = plan["tuning_seeds"], {"finalists": plan["finalists"], "max_rounds": plan["max_rounds"]}
    at_arm, at = INNER_AT
    inner_run = evaluate(at_arm, None)
    inner = grid_search(
        lambda cells: inner_run([({**at, **s}, seed) for s, seed in cells]), plan["spaces"]["inner"], seeds, **kw
    )
    lr = inner["winner"]["inner_lr"]
    arms = {a: grid_search(evaluate(a, lr), plan["spaces"][ARMS[a][0]], seeds, valid=valid, **kw) for a in TUNED}
    return {"inner": inner, "inner_lr": lr, "arms": arms, "at_workers": n}


def outer(arm: str, setting: dict[str, Any] | None) -> dict[str, Any] | None:
    """An arm's outer optimizer config from a grid setting."""
    if setting is None:
        return None
    algo = ARMS[arm][0]
    return {
        **RULE[algo],
        "lr": setting["lr"],
        "momentum": setting["momentum"],
        **({"nesterov": setting["nesterov"]} if algo == "diloco" else {}),
    }


def analyse(
    res: dict,
    n: int,
    seeds: list[int],
    params: int,
    h: int,
    steps: int,
    tokens_per_step: int,
    fits: dict,
    tuning: dict,
    rules: dict[str, dict],
) -> dict[str, Any]:
    """Stages 2-4 for one N: per-arm finals, the fixed rules' decisions, steps to DiLoCo's best final loss, comm."""
    arms: dict[str, Any] = {}
    for label, (algo, mult) in ARMS.items():
        rs = [res[(n, label, s)] for s in seeds]
        bps, wps = comm_per_step(algo, n, mult * h, params, fits)
        t = tuning["arms"].get(label)
        arms[label] = {
            "algorithm": algo,
            "H": None if algo == "ddp" else mult * h,
            "outer_optimizer": outer(label, t and t["winner"]),
            **{
                k: mean_std([r[k] for r in rs])
                for k in (
                    "final_test_loss",
                    "final_test_ppl",
                    "final_val_loss",
                    "final_test_loss_avg_model",
                    "test_loss_replica_spread",
                    "train_s",
                )
            },
            # runs cached before the bits were recorded have none: the arm then reports none
            "final_test_bpb": mean_std([r["final_test_bpb"] for r in rs])
            if all(r.get("final_test_bpb") is not None for r in rs)
            else None,
            "bytes_per_step": bps,
            "wan_s_per_step": wps,
            "mb_sent_per_node": bps * steps / 1e6,
            "wan_sync_s": wps * steps,
            "val_curve_mean": mean_curve([r["val_curve"] for r in rs]),
            "val_curves": [r["val_curve"] for r in rs],
            "tuning_vs_eval": consistency(t["winner_values"], [r["final_val_loss"] for r in rs]) if t else None,
        }
    loss = {a: arms[a]["final_test_loss"]["values"] for a in ARMS}
    decisions = {
        name: decision(name, x, y, rules[name], loss[x], loss[y], "final test loss, mean over all replicas")
        for name, (x, y) in COMPARISONS.items()
    }
    secondary = {
        name: {
            k: decide(arms[x][k]["values"], arms[y][k]["values"], DecisionRule(**rules[name]))
            for k in ("final_test_ppl", "final_test_loss_avg_model")
        }
        for name, (x, y) in COMPARISONS.items()
    }
    per_seed = [
        steps_to_best({a: arms[a]["val_curves"][k] for a in ARMS}, ["diloco_2H", "diloco_H"]) for k in range(len(seeds))
    ]
    to_target: dict[str, Any] = {"per_seed": per_seed}
    for a in ARMS:
        st = [p["steps"][a] for p in per_seed]
        to_target[a] = {
            "reached": sum(s is not None for s in st),
            "steps": mean_std(st) if all(s is not None for s in st) else None,
        }
    for name in ("noloco_H_vs_diloco_2H", "noloco_H_vs_diloco_H"):
        x, y = COMPARISONS[name]
        sx, sy = [p["steps"][x] for p in per_seed], [p["steps"][y] for p in per_seed]
        both = all(s is not None for s in sx + sy)
        to_target[name] = {
            "steps": decision(name, x, y, STEPS_RULE, sx, sy, "inner steps to DiLoCo's best final val loss")
            if both
            else None,
            "speedup": mean_std([b / a - 1 for a, b in zip(sx, sy)]) if both else None,  # y's steps / x's - 1
        }
    delta_curves = {}
    for name in ("noloco_H_vs_diloco_2H", "noloco_H_vs_diloco_H"):
        x, y = COMPARISONS[name]
        delta_curves[name] = [
            {"step": px[0]["step"], "mean": d["mean_diff"], "ci95": d["ci"]}
            for px, py in zip(zip(*arms[x]["val_curves"]), zip(*arms[y]["val_curves"]))
            for d in [decide([p["val_loss"] for p in px], [p["val_loss"] for p in py], STEPS_RULE)]
        ]
    cell = {
        "workers": n,
        "params": params,
        "tokens": steps * tokens_per_step,
        "tokens_per_step": tokens_per_step,
        "arms": arms,
        "decisions": decisions,
        "secondary": secondary,
        "to_target": to_target,
        "delta_curves": delta_curves,
    }
    cell["to_2h_final"] = steps_to_2h_final(cell)
    return cell


def steps_to_2h_final(cell: dict) -> dict[str, Any]:
    """Inner steps to DiLoCo 2H's own final val loss, per seed: the bar of the paper's 1:2 comparison
    ("NoLoCo converges faster than DiLoCo at twice its H"), read off the stored curves: the per-seed
    targets, each arm's steps (None: not reached) and the decision NoLoCo - DiLoCo 2H."""
    arms = cell["arms"]
    targets = [curve[-1]["val_loss"] for curve in arms["diloco_2H"]["val_curves"]]
    steps = {
        a: [first_step_at(cv, t) for cv, t in zip(arms[a]["val_curves"], targets)] for a in ("noloco_H", "diloco_2H")
    }
    sx, sy = steps["noloco_H"], steps["diloco_2H"]
    both = all(s is not None for s in sx + sy)
    return {
        "targets": targets,
        "steps": steps,
        "decision": decision(
            "noloco_H_to_diloco_2H_final",
            "noloco_H",
            "diloco_2H",
            STEPS_RULE,
            sx,
            sy,
            "inner steps to DiLoCo 2H's final val loss",
        )
        if both
        else None,
        "speedup": mean_std([b / a - 1 for a, b in zip(sx, sy)]) if both else None,
    }


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(
        __doc__.splitlines()[0],
        seeds=8,
        smoke={
            "workers": [4],
            "inner_steps": 2,
            "steps": 16,
            "seeds": 2,
            "finalists": 1,
            "max_rounds": 1,
            "small_grid": True,
        },
    )
    ap.add_argument(
        "--workers", type=int, nargs="+", default=[8], help="N replicas; the grid runs at the first (8 16: N=16 too)"
    )
    ap.add_argument("--model", choices=MODEL_SIZES, default="xs")
    ap.add_argument("--tokens-per-param", type=float, default=20.0)
    ap.add_argument("--inner-steps", type=int, default=8, help="NoLoCo's H (DiLoCo gets 2H and H); paper 50 vs 100")
    ap.add_argument(
        "--steps", type=int, default=0, help="inner steps of every run (a multiple of 2H); 0: >= --tokens-per-param"
    )
    ap.add_argument("--local-batch", type=int, default=4, help="sequences per replica per step")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--eval-blocks", type=int, default=16, help="val blocks per domain for the curves (eval every 2H)")
    ap.add_argument("--final-blocks", type=int, default=64, help="val/test blocks per domain for the final losses")
    ap.add_argument("--tuning-seeds", type=int, nargs="+", default=[100, 101])
    ap.add_argument("--finalists", type=int, default=4, help="grid points run on every tuning seed (0: all)")
    ap.add_argument("--max-rounds", type=int, default=8, help="rounds of each grid's walk")
    ap.add_argument("--small-grid", action="store_true", help="start each grid at its centre only (smoke)")
    ap.add_argument("--pairing-seed", type=int, default=-1, help="NoLoCo partner stream; -1: the official sequence")
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (processes)")
    add_corpus_flags(ap)
    args = parse(ap, argv)
    h, model = args.inner_steps, MODEL_SIZES[args.model]
    params = model_params(model, args.seq_len)
    tokens_per_step = args.workers[0] * args.local_batch * args.seq_len
    steps = args.steps or steps_for(params, tokens_per_step, args.tokens_per_param, 2 * h)
    if steps % (2 * h):
        raise SystemExit(f"config error: steps={steps} must be a multiple of 2H={2 * h}")
    spaces = {
        k: (
            {n: Axis(a.ladder, (a.start[len(a.start) // 2],), a.ordered) for n, a in sp.items()}
            if args.small_grid
            else sp
        )
        for k, sp in {**SPACES, "inner": INNER_SPACE}.items()
    }
    data = recipe_sections([f"data={args.data}", *args.override])["data"]
    corpus = corpus_facts(data, model, args.seq_len)
    # the corpus hash rides in every job: a run cached on other text is never reused
    base = {
        "steps": steps,
        "local_batch": args.local_batch,
        "seq_len": args.seq_len,
        "data": data,
        "corpus_hash": corpus["hash"],
        "warmup": args.warmup,
        "eval_every": 2 * h,
        "eval_blocks": args.eval_blocks,
        "final_blocks": args.final_blocks,
        "model": model,
        "pairing_seed": None if args.pairing_seed < 0 else args.pairing_seed,
    }
    fits = json.loads((RESULTS / "comm_sync.json").read_text())["figures"]["fits"]
    tune_n, seeds = args.workers[0], seed_list(args.seeds)
    plan = {
        "tuning_seeds": args.tuning_seeds,
        "finalists": args.finalists or None,
        "max_rounds": args.max_rounds,
        "parallel": args.parallel,
        "spaces": spaces,
    }
    config = {
        "protocol": {**base, "noloco_H": h, "diloco_2H": 2 * h},
        "model_size": args.model,
        "params": params,
        "workers": args.workers,
        "data_name": args.data,
        "overrides": args.override,
        "arms": {k: list(v) for k, v in ARMS.items()},
        "seeds": seeds,
        "tuning": {
            "seeds": args.tuning_seeds,
            "at_workers": tune_n,
            "finalists": plan["finalists"],
            "max_rounds": args.max_rounds,
            "spaces": {
                k: {n: [list(a.ladder), list(a.start), a.ordered] for n, a in sp.items()} for k, sp in spaces.items()
            },
            "inner_at": list(INNER_AT),
            "rules": RULE,
        },
        "selection": "final val loss, mean over all replicas, mean over the tuning seeds",
        "comm_fits": {k: fits[k] for k in ("emulated/pair", "emulated/ring")},
        "emulation": "in-process replicas",
        "decision_rules": preregister(CACHE_DIR, "noloco_convergence", {**RULES, "steps": STEPS_RULE}, args.fresh),
    }
    hz = Harness(
        "noloco_convergence", __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke
    )

    def make_job(arm: str, setting: dict | None, n: int, seed: int, inner_lr: float) -> dict:
        algo, mult = ARMS[arm]
        j = {**base, "workers": n, "algorithm": algo, "seed": seed, "inner_lr": inner_lr}
        return j if algo == "ddp" else {**j, "inner_steps": mult * h, "outer_optimizer": outer(arm, setting)}

    tuning = tune(hz, make_job, tune_n, plan)
    best = {a: tuning["arms"][a]["winner"] for a in TUNED}
    # N-major then seed-major, so a cut-short run has whole (N, seed)s
    jobs = {
        (n, a, s): make_job(a, best.get(a), n, s, tuning["inner_lr"]) for n in args.workers for s in seeds for a in ARMS
    }
    res = dict(
        zip(jobs, hz.run_jobs(list(jobs.values()), train_run, desc="arms (eval seeds, test)", parallel=args.parallel))
    )
    figures: dict[str, Any] = {"tuning": tuning, "steps": steps, "cells": {}}
    for n in args.workers:
        figures["cells"][f"N={n}"] = analyse(
            res,
            n,
            seeds,
            res[(n, "ddp", seeds[0])]["params"],
            h,
            steps,
            n * args.local_batch * args.seq_len,
            fits,
            tuning,
            config["decision_rules"],
        )
    logged = {json.dumps(r["corpus"], sort_keys=True) for r in res.values() if r.get("corpus")}
    figures["corpus"] = corpus if len(logged) <= 1 else {"name": "mixed", "hash": None}
    figures["tokens_per_param"] = steps * tokens_per_step / params
    figures["epochs"] = steps * tokens_per_step / corpus["train_tokens"]
    figures["unmet"] = unmet(tuning["arms"], args.tuning_seeds, seeds, figures["tokens_per_param"], figures["corpus"])
    figures["departures"] = [
        f"model: Llama {model} ({params:,} params) vs the paper's 125M-6.8B; inner AdamW lr {tuning['inner_lr']:g} "
        f"(checked once), cosine, warmup {args.warmup}",
        f"H: NoLoCo H={h} vs DiLoCo 2H={2 * h} (paper 50 vs 100), same 1:2 ratio; {steps} inner steps = "
        f"{steps // (2 * h)} DiLoCo 2H rounds (paper: thousands of steps)",
        f"data: data={args.data} {' '.join(args.override)}, seq {args.seq_len}, {args.local_batch} sequences per "
        "replica per step (paper: web text, seq 1024+)",
        f"tuning at N={tune_n} only, on seeds {args.tuning_seeds}; the winners are reused at every other N",
        "DDP: one replica with the global batch (same tokens/step); no outer settings",
        "NoLoCo partners: "
        + (
            "the official sequence default_rng(k*H+1), the same on every seed"
            if base["pairing_seed"] is None
            else f"decentrain's stream, pairing_seed {base['pairing_seed']}"
        ),
        "curves: val subset (eval_blocks per domain), all-replica mean; final losses on val/test subsets "
        "(final_blocks per domain)",
        "in-process replicas (threads) instead of processes; no pipeline parallelism or random routing",
        "WAN seconds: sync only (alpha-beta fit of comm_sync's emulated link), compute excluded",
    ]
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


# -- JSON -> TXT / PNG / README row -----------------------------------------------------
def _opt(o: dict | None) -> str:
    if o is None:
        return ""
    kind = "" if "nesterov" not in o else (" nesterov" if o["nesterov"] else " heavy-ball")
    return f"{o['name']}{kind} {o['lr']:g}/{o['momentum']:g}"


def _setting(s: dict) -> str:
    return " ".join(("nesterov" if v else "heavy-ball") if k == "nesterov" else f"{k}={v:g}" for k, v in s.items())


def headline(cell: dict) -> str:
    return describe(cell["decisions"]["noloco_H_vs_diloco_2H"]["result"])


def text(rec: dict) -> str:
    f, p, cfg = rec["figures"], rec["config"]["protocol"], rec["config"]
    t = f["tuning"]
    lines = [
        header(rec),
        "",
        f"NoLoCo H={p['noloco_H']} vs DiLoCo 2H={p['diloco_2H']} (the paper's 1:2) and DiLoCo H={p['noloco_H']} "
        f"(equal H), DDP as reference; {f['steps']} inner steps at equal tokens ({f['tokens_per_param']:.1f} "
        f"tokens/param, {f.get('epochs', 0):.1f} epochs), data={cfg['data_name']} (corpus "
        f"{f['corpus'].get('name')} {f['corpus'].get('hash') or f['corpus'].get('note')}); "
        f"N={cfg['workers']}; tuning seeds {cfg['tuning']['seeds']} at N={t['at_workers']}, "
        f"eval seeds {cfg['seeds']}; {cfg['emulation']}",
        "decision rules (fixed before the run): " + describe_rules(cfg["decision_rules"]),
        "protocol: " + ("met" if not f["unmet"] else "NOT MET: " + "; ".join(f["unmet"])),
        f"inner lr {t['inner_lr']:g}: {describe_tuning(t['inner'])}",
    ]
    for a, g in t["arms"].items():
        lines.append(f"{a} tuned: {describe_tuning(g, _setting)}")
    lines.append("")
    for key, c in f["cells"].items():
        lines += [
            f"== {key}: {c['params'] / 1e3:.0f}k params, {c['tokens'] / 1e6:.2f}M tokens ==",
            "decisions, paired per seed (x - y; final test loss, mean over all replicas' models):",
        ]
        for name, d in c["decisions"].items():
            lines.append(f"  {name:24s} {describe(d['result'], 4)}")
        s = c["secondary"]["noloco_H_vs_diloco_2H"]
        lines.append(
            f"  {'':24s} Δppl (replica-averaged) {describe(s['final_test_ppl'])}; averaged model "
            f"{describe(s['final_test_loss_avg_model'], 4)}"
        )
        tt = c["to_target"]
        lines.append("inner steps to DiLoCo's best final val loss (per seed: best of diloco_2H / diloco_H):")
        for a in ARMS:
            x = tt[a]
            lines.append(
                f"  {a:10s} "
                + (f"{fmt(x['steps'], 1)} steps" if x["steps"] else "—")
                + f"  (reached {x['reached']}/{len(tt['per_seed'])})"
            )
        for name in ("noloco_H_vs_diloco_2H", "noloco_H_vs_diloco_H"):
            d = tt[name]["steps"]
            lines.append(f"  {name}: " + (describe(d["result"], 1) if d else "not reached on every seed by both arms"))
        d2 = c["to_2h_final"]["decision"]
        lines.append(
            "inner steps to DiLoCo 2H's own final val loss, NoLoCo H - DiLoCo 2H: "
            + (describe(d2["result"], 1) if d2 else "not reached on every seed")
        )
        lines.append(
            f"{'arm':10s} {'outer':>22s} {'test loss, all replicas':>24s} {'ppl, replica mean':>18s} "
            f"{'avg model':>17s} {'MB/node':>8s} {'WAN s':>7s}  tuning vs eval seeds (val)"
        )
        for label, r in c["arms"].items():
            tvs = describe_consistency(r["tuning_vs_eval"])
            lines.append(
                f"{label:10s} {_opt(r['outer_optimizer']):>22s} {fmt(r['final_test_loss']):>24s} "
                f"{fmt(r['final_test_ppl'], 3):>18s} {fmt(r['final_test_loss_avg_model']):>17s} "
                f"{r['mb_sent_per_node']:8.1f} {r['wan_sync_s']:7.1f}  {tvs}"
                + (f"; test bpb {fmt(r['final_test_bpb'], 4)}" if r.get("final_test_bpb") else "")
            )
        lines.append("")
    lines += ["departures from the paper's protocol:"] + [f"  - {d}" for d in f["departures"]]
    lines.append("train s in the JSON: measured on a shared 2-core machine under load, for orientation only")
    lines += ["", "README row: " + readme_row(rec)]
    return "\n".join(lines)


def readme_row(rec: dict) -> str:
    """The README reproduction-table row (benchmarks/repro_table.py), from the JSON alone."""
    f, p = rec["figures"], rec["config"]["protocol"]
    cells = [
        f"{key} ({c['params'] / 1e3:.0f}k): vs DiLoCo 2H {headline(c)}; vs DiLoCo H "
        f"{describe(c['decisions']['noloco_H_vs_diloco_H']['result'])}; vs DDP "
        f"{describe(c['decisions']['noloco_H_vs_ddp']['result'])}"
        for key, c in f["cells"].items()
    ]
    verdict = "; ".join(
        f"{k} **{c['decisions']['noloco_H_vs_diloco_2H']['result']['verdict']}**" for k, c in f["cells"].items()
    )
    ours = (
        f"NoLoCo H={p['noloco_H']} − DiLoCo 2H={p['diloco_2H']}, final test loss over all replicas, paired over "
        f"{len(rec['config']['seeds'])} eval seeds, {f['steps']} steps ({f['tokens_per_param']:.0f} tokens/param), "
        f"every arm tuned over all its outer settings on {len(rec['config']['tuning']['seeds'])} tuning seeds: "
        + "; ".join(cells)
        + ("" if not f["unmet"] else f". Protocol not met: {'; '.join(f['unmet'])}")
    )
    return (
        f"| noloco_convergence | NoLoCo (H=50) up to 4% faster convergence than DiLoCo (H=100) | {ours} | "
        f"NoLoCo H better than DiLoCo 2H (95 % CI below 0): {verdict} | `python -m benchmarks.noloco_convergence` |"
    )


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    cells = list(f["cells"])
    fig, axes = plt.subplots(len(cells) + 1, 3, figsize=(16, 3.8 * (len(cells) + 1)), squeeze=False)
    for row, key in enumerate(cells):
        c = f["cells"][key]
        for label, r in c["arms"].items():
            cur = r["val_curve_mean"]
            axes[row][0].plot(
                [p["step"] for p in cur],
                [p["val_loss"] for p in cur],
                "--" if label.startswith("diloco") else "-",
                marker=".",
                ms=3,
                label=f"{label} {_opt(r['outer_optimizer'])}",
            )
            axes[row][2].plot(
                [p["step"] * r["wan_s_per_step"] for p in cur],
                [p["val_loss"] for p in cur],
                marker=".",
                ms=3,
                label=label,
            )
        lo = min(p["val_loss"] for r in c["arms"].values() for p in r["val_curve_mean"])
        axes[row][0].set(
            xlabel="inner step (equal tokens)",
            ylabel=f"{key}\nval loss (all replicas, seed mean)",
            ylim=(lo - 0.05, lo + 0.8),
        )
        axes[row][0].legend(fontsize=7)
        for name, dc in c["delta_curves"].items():
            xs = [p["step"] for p in dc]
            (line,) = axes[row][1].plot(xs, [p["mean"] for p in dc], label=name)
            if all(p["ci95"] for p in dc):
                axes[row][1].fill_between(
                    xs, [p["ci95"][0] for p in dc], [p["ci95"][1] for p in dc], color=line.get_color(), alpha=0.2
                )
        axes[row][1].axhline(0, color="k", lw=0.8)
        axes[row][1].set(xlabel="inner step", ylabel="paired Δ val loss (95% CI)", ylim=(-0.15, 0.15))
        axes[row][1].legend(fontsize=7)
        axes[row][2].set(xlabel="modelled emulated-WAN sync s (secondary)", xscale="symlog", ylim=(lo - 0.05, lo + 0.8))
    for col, (a, g) in enumerate(f["tuning"]["arms"].items()):
        ax, w = axes[-1][col], g["winner"]
        pts = [
            p
            for p in g["points"]
            if p["mean"] is not None and all(p["setting"].get(k) == v for k, v in w.items() if k == "nesterov")
        ]
        lrs, moms = sorted({p["setting"]["lr"] for p in pts}), sorted({p["setting"]["momentum"] for p in pts})
        vals = {(p["setting"]["lr"], p["setting"]["momentum"]): p["mean"] for p in pts}
        im = ax.imshow(
            [[vals.get((lr, m), float("nan")) for m in moms] for lr in lrs],
            origin="lower",
            aspect="auto",
            cmap="viridis_r",
        )
        ax.set(
            xticks=range(len(moms)),
            xticklabels=[f"{m:g}" for m in moms],
            yticks=range(len(lrs)),
            yticklabels=[f"{lr:g}" for lr in lrs],
            xlabel="outer momentum",
            ylabel="outer lr",
            title=f"{a} (tuning-seed mean): chosen {_setting(w)}",
        )
        ax.plot(moms.index(w["momentum"]), lrs.index(w["lr"]), "r*", ms=12)
        fig.colorbar(im, ax=ax, label="final val loss")
    verdicts = ", ".join(
        f"{k} {c['decisions']['noloco_H_vs_diloco_2H']['result']['verdict']}" for k, c in f["cells"].items()
    )
    fig.suptitle(f"{rec['name']} @ {rec['git_sha'][:10]}: NoLoCo H vs DiLoCo 2H, tuned: {verdicts}")
    fig.tight_layout()
    save_figure(fig, png, dpi=90)


if __name__ == "__main__":
    main()
