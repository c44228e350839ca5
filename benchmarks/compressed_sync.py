"""compressed_sync: does SparseLoCo (and compressed NoLoCo) reach DiLoCo's loss, and at how many fewer bytes?

Each run is the library's own training loop (`Trainer` and the algorithm's hooks) with N replicas as
threads over the in-process transport (algorithms/pretraining/inprocess_replicas.py), on CPU. Arms share
everything but `algorithm`: model, data (`--data`, a Hydra data option, plus `--override`s), seed, global
batch (split over the N replicas), inner AdamW and its schedule, steps. Steps are set so every run reads
>= `--tokens-per-param` (20) tokens per parameter (all replicas' tokens), rounded up to a multiple of 40.

The protocol (benchmarks/protocol.py, docs/benchmarks.md), per N:
  0. the inner lr, checked once for all arms: DiLoCo at the paper's point (Nesterov 0.9, lr 0.7) over an
     inner-lr ladder on the tuning seeds; every arm then trains at the winner;
  1. every arm searched over all its outer settings on tuning seeds 100, 101 (`grid_search`: the product of
     coarse start values, then the winner's unrun ladder neighbours until it is bracketed; every point on
     seed 100, the best `--finalists` on both, the winner by the two-seed mean, the runner-up reported,
     disagreeing seeds flagged):
       diloco     outer lr x momentum x (Nesterov or heavy ball), at H = `--diloco-h`
       sparseloco outer lr x EF decay x H (plain SGD outer, as the paper)
       noloco_c   outer lr x EF decay x H (NoLoCo momentum 0.5), N >= 4 only: at N = 2 the same pair meets
                  every round and the consensus message is identically zero (DESIGN.md)
  2. each arm at its winner on `--seeds` (8) evaluation seeds 0..7, disjoint from the tuning seeds;
  3. the decisions, fixed before the run (`RULES`, stored in the record and beside the run cache): each
     compressed arm "reaches" DiLoCo's final eval loss by equivalence (TOST, ±1 % of DiLoCo's mean, paired
     by seed), else better / worse / undecided with the effect the run could detect. Bytes per replica,
     two ways: payload (SparseLoCo's and compressed NoLoCo's logged `outer/payload_bytes`, header included;
     DiLoCo's dense fp32 pseudo-gradient, 4·numel) and wire (the logged `outer/bytes_sent`, a ring
     all-gather; DiLoCo's ring all-reduce 2(N−1)/N·4·numel), over the whole run and until the seed-mean
     curve first reaches DiLoCo's seed-mean final loss + 1 %.

Compute, measured on this 2-core box (`--model s`, 92,400 params, global batch 32 x seq 64 = 2048 tokens/step,
920 steps = 20.4 tokens/param): quiet, ~45k tokens/s for DiLoCo at N=4, so ~40 CPU-s a run (SparseLoCo and
compressed NoLoCo ~1.6x that: their compression runs in Python); at load 9-15, 120-step runs took 18-33 s
wall (135-250 s for a whole run). A simulated walk from the coarse start takes ~33 runs per arm (18 start
points, ~3 rounds, the finalists' second seed); with 3-7 inner-lr runs and 8 eval seeds per arm that is
~130 runs at N=4 and ~90 at N=2, about 3 CPU-hours; `--parallel 2` takes ~1.5 h on a quiet box and 3-6 h
on the shared one. `--model xs` (49,824 params, 520 steps) costs about a third. It resumes from the run cache.

Departures from the SparseLoCo paper's protocol, named: a 92k-parameter model (paper 512M), ~1k steps,
N replicas as threads on one CPU; DiLoCo's H fixed (its lr, momentum and Nesterov/heavy ball tuned);
SparseLoCo's density and 2-bit quantiser and compressed NoLoCo's message sizes and momentum are fixed;
eval loss is rank 0's replica (NoLoCo's replicas differ); NoLoCo runs without the stall rule.

    # the committed protocol (the lead runs it on the pinned corpus):
    nohup python -m benchmarks.compressed_sync --data pinned --ranks 2 4 --parallel 2 > runs/compressed_sync.log 2>&1 &
    python -m benchmarks.compressed_sync --smoke                                    # the whole path (75 s at load 9)
    # compare preset:
    python -m benchmarks.compressed_sync --preset-from benchmarks/results/compressed_sync.json --preset-ranks 4
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    CACHE_DIR,
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
from benchmarks.harness import (
    MODEL_SIZES as SIZES,
)
from benchmarks.protocol import (
    Axis,
    DecisionRule,
    consistency,
    decision,
    describe,
    describe_consistency,
    describe_rules,
    describe_tuning,
    grid_search,
    preregister,
    unmet,
)

METHODS = ("diloco", "sparseloco", "noloco_c")
MIN_RANKS = {"diloco": 2, "sparseloco": 2, "noloco_c": 4}
LR = (0.125, 0.18, 0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)  # the outer optimizers accept (0, 4]
MOMENTUM = (0.0, 0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
EF_DECAY = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
H = (5, 10, 20, 40)
INNER_LR = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
# coarse start values (every other rung): the walk refines around the winner
SPACES = {
    "diloco": {
        "lr": Axis(LR, (0.35, 0.7, 1.4)),
        "momentum": Axis(MOMENTUM, (0.1, 0.5, 0.9)),
        "nesterov": Axis((False, True), (False, True), ordered=False),
    },
    "sparseloco": {
        "lr": Axis(LR, (0.5, 1.0, 2.0)),
        "ef_decay": Axis(EF_DECAY, (0.8, 0.95, 0.99)),
        "h": Axis(H, (5, 20)),
    },
    "noloco_c": {
        "lr": Axis(LR, (0.35, 0.7, 1.4)),
        "ef_decay": Axis(EF_DECAY, (0.8, 0.95, 0.99)),
        "h": Axis(H, (5, 20)),
    },
}
INNER_SPACE = {"inner_lr": Axis(INNER_LR, (5e-4, 1e-3, 2e-3))}
INNER_AT = {"lr": 0.7, "momentum": 0.9, "nesterov": True}  # DiLoCo's paper point, where the inner lr is checked
RULES = {f"{m}_reaches_diloco": DecisionRule("reaches", margin=0.01) for m in ("sparseloco", "noloco_c")}
STEP_MULTIPLE = 40  # every H of the ladder divides it, so every arm ends (and is evaluated) on a sync


def valid(s: dict[str, Any]) -> bool:
    return not (s.get("nesterov") and s.get("momentum") == 0)  # torch's Nesterov needs momentum


def _algorithm(job: dict[str, Any]) -> dict[str, Any]:
    m, s, fx = job["method"], job["setting"], job["fixed"]
    if m == "diloco":
        return {
            "name": "diloco",
            "inner_steps": job["h"],
            "outer_optimizer": {"name": "sgd", "lr": s["lr"], "momentum": s["momentum"], "nesterov": s["nesterov"]},
        }
    if m == "noloco_c":
        return {
            "name": "noloco",
            "inner_steps": job["h"],
            "stall_s": None,
            "outer_optimizer": {"name": "noloco", "lr": s["lr"], "momentum": fx["noloco_momentum"]},
            "compression": {
                "enabled": True,
                "ef_decay": s["ef_decay"],
                "topk": fx["topk"],
                "bits": fx["bits"],
                "state_topk": fx["state_topk"],
                "state_bits": fx["state_bits"],
                "anchor_every": fx["anchor_every"],
            },
        }
    return {
        "name": "sparseloco",
        "inner_steps": job["h"],
        "ef_decay": s["ef_decay"],
        "topk": fx["topk"],
        "bits": fx["bits"],
        "outer_optimizer": {"name": "sgd", "lr": s["lr"], "momentum": 0.0, "nesterov": False},
    }


def _config(job: dict[str, Any]) -> dict[str, Any]:
    micro = job["batch"] // job["ranks"]
    return {
        "algorithm": _algorithm(job),
        "model": model_section(job["model"], job["seq_len"]),
        "data": {**job["data"], "seq_len": job["seq_len"]},
        "optim": {"lr": job["inner_lr"], "warmup_steps": job["warmup"]},
        # the same held-out sequences at every N: eval_batches × micro_batch_size per domain
        "train": {
            "steps": job["steps"],
            "global_batch_size": job["batch"],
            "micro_batch_size": micro,
            "eval_every": math.lcm(job["h"], job["eval_every"]),
            "eval_batches": max(1, job["eval_seqs"] // micro),
            "checkpoint_every": 10**6,
            "threads": 1,
            "seed": job["seed"],
            "device": "cpu",
        },
        "logger": {"progress": False, "console": False, "log_every": job["h"]},
    }


def sync_bytes(
    method: str, rows: list[dict[str, Any]], numel: int, n: int
) -> tuple[list[int], list[float], list[float]]:
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
    diverged = None
    with tempfile.TemporaryDirectory(prefix="compressed_sync_") as d:
        try:
            run_replicas_in_process(cfg, job["ranks"], Path(d))
        except RuntimeError as e:  # a diverged grid point loses; anything else stops the benchmark
            if (diverged := divergence(e)) is None:
                raise
        rows = read_jsonl(Path(d) / "metrics.jsonl") if (Path(d) / "metrics.jsonl").exists() else []
    numel = sum(p.numel() for p in build_model(cfg.model, build_tokenizer(cfg.model)).parameters())
    steps, payload, wire = sync_bytes(job["method"], rows, numel, job["ranks"])
    curve, bpb = [], None
    for r in rows:
        if "eval/loss" in r:
            done = [i for i, s in enumerate(steps) if s <= r["step"]]
            curve.append([r["step"], r["eval/loss"], sum(payload[i] for i in done), sum(wire[i] for i in done)])
            bpb = r.get("eval/bpb", bpb)
    return {
        "numel": numel,
        "curve": curve,
        "syncs": len(steps),
        "final": math.inf if diverged or not curve else curve[-1][1],
        "final_bpb": bpb,
        "corpus": corpus_of(rows),
        "diverged": diverged,
    }


def plan_steps(params: int, tokens_per_step: int, tokens_per_param: float) -> int:
    return steps_for(params, tokens_per_step, tokens_per_param, STEP_MULTIPLE)


# -- tuning (stages 0 and 1) ---------------------------------------------------------------------
def tune(harness: Harness, shared: dict[str, Any], n: int, plan: dict[str, Any]) -> dict[str, Any]:
    """The inner lr once for all arms, then every arm's outer settings, at N replicas."""

    def evaluator(method: str, inner_lr: float | None = None):
        def evaluate(cells: list[tuple[dict, int]]) -> list[float]:
            jobs = [
                _job(
                    shared,
                    n,
                    method,
                    {k: v for k, v in s.items() if k != "inner_lr"},
                    seed,
                    s.get("inner_lr", inner_lr),
                )
                for s, seed in cells
            ]
            return [
                r["final"]
                for r in harness.run_jobs(jobs, train_run, desc=f"tune {method} N={n}", parallel=plan["parallel"])
            ]

        return evaluate

    seeds, kw = plan["tuning_seeds"], {"finalists": plan["finalists"], "max_rounds": plan["max_rounds"]}
    inner_space = plan["spaces"].get("inner", INNER_SPACE)
    inner_eval = evaluator("diloco")
    inner = grid_search(
        lambda cells: inner_eval([({**INNER_AT, **s}, seed) for s, seed in cells]), inner_space, seeds, **kw
    )
    lr = inner["winner"]["inner_lr"]
    arms = {
        m: grid_search(evaluator(m, lr), plan["spaces"][m], seeds, valid=valid, **kw)
        for m in plan["methods"]
        if n >= MIN_RANKS[m]
    }
    return {"inner": inner, "inner_lr": lr, "arms": arms}


def _job(
    shared: dict[str, Any], n: int, method: str, setting: dict[str, Any], seed: int, inner_lr: float
) -> dict[str, Any]:
    h = shared["diloco_h"] if method == "diloco" else setting["h"]
    return {**shared, "ranks": n, "method": method, "setting": setting, "h": h, "seed": seed, "inner_lr": inner_lr}


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


def figures_for(
    n: int, tuning: dict[str, Any], runs: dict[str, list[dict[str, Any]]], rules: dict[str, dict]
) -> dict[str, Any]:
    """One N's figures from its eval runs (`runs`: arm -> its seeds' results, seed order) under the fixed rules."""
    finals = {m: [r["final"] for r in rs] for m, rs in runs.items()}
    # curves: the runs that finished
    runs = {m: [r for r in rs if not r.get("diverged")] or rs for m, rs in runs.items()}
    base_curve = seed_mean_curve(runs["diloco"])
    target = 1.01 * mean_std(finals["diloco"])["mean"]
    base_hit = bytes_to(base_curve, target)
    out: dict[str, Any] = {
        "ranks": n,
        "numel": runs["diloco"][0]["numel"],
        "target_loss": target,
        "arms": {},
        "decisions": {},
    }
    for m, rs in runs.items():
        curve = seed_mean_curve(rs)
        hit, syncs = bytes_to(curve, target), rs[0]["syncs"]
        t = tuning["arms"][m]
        out["arms"][m] = {
            "setting": t["winner"],
            "h": rs[0].get("h"),
            "final": mean_std(finals[m]),
            "curve": curve,
            "syncs": syncs,
            "final_bpb": mean_std([r["final_bpb"] for r in rs])
            if all(r.get("final_bpb") is not None for r in rs)
            else None,
            "payload_per_sync": curve[-1][2] / max(syncs, 1),
            "wire_per_sync": curve[-1][3] / max(syncs, 1),
            "payload_total": curve[-1][2],
            "wire_total": curve[-1][3],
            "payload_ratio_run": base_curve[-1][2] / curve[-1][2] if curve[-1][2] else None,
            "wire_ratio_run": base_curve[-1][3] / curve[-1][3] if curve[-1][3] else None,
            "to_target": None
            if hit is None or base_hit is None
            else {
                "step": hit[0],
                "payload": hit[1],
                "wire": hit[2],
                "payload_ratio": base_hit[1] / hit[1] if hit[1] else None,
                "wire_ratio": base_hit[2] / hit[2] if hit[2] else None,
            },
            "tuning_vs_eval": consistency(t["winner_values"], finals[m]),
        }
    for name, rule in rules.items():
        m = name.split("_reaches_")[0]
        if m in runs:
            out["decisions"][name] = decision(
                name, m, "diloco", rule, finals[m], finals["diloco"], "final eval loss (rank 0)"
            )
    return out


def headline(cell: dict[str, Any]) -> list[str]:
    """Per compressed arm: its verdict against DiLoCo's loss, beside the bytes it saves over the run."""
    out = []
    for name, d in cell["decisions"].items():
        a = cell["arms"][d["contender"]]
        out.append(
            f"{d['contender']} vs DiLoCo: {describe(d['result'])}; {a['payload_ratio_run']:.1f}x fewer payload bytes "
            f"({a['wire_ratio_run']:.1f}x wire) over the run"
        )
    return out


def text(record: dict) -> str:
    c, f = record["config"], record["figures"]
    lines = [
        header(record),
        "",
        f"model {c['model_size']} {c['model']}, {c['steps']} steps x {c['batch']} x {c['seq_len']} tokens "
        f"({f.get('tokens_per_param', 0):.1f} tokens/param, {f.get('epochs', 0):.1f} epochs of the training text), "
        f"data={c['data_name']} (corpus {f.get('corpus', {}).get('name')} "
        f"{f.get('corpus', {}).get('hash') or f.get('corpus', {}).get('note')}), "
        f"tuning seeds {c['tuning_seeds']}, eval seeds {c['eval_seeds']}; SparseLoCo top-{c['fixed']['topk']} per "
        f"64x64 tile, {c['fixed']['bits']}-bit; DiLoCo at H={c['diloco_h']}",
        "decision rules (fixed before the run): " + describe_rules(c["decision_rules"]),
        "protocol: " + ("met" if not f.get("unmet") else "NOT MET: " + "; ".join(f["unmet"])),
    ]
    for key, cell in f["cells"].items():
        lines += [
            "",
            f"== N={cell['ranks']} ({cell['numel']:,} parameters); inner lr {cell['tuning']['inner_lr']:g} "
            f"({describe_tuning(cell['tuning']['inner'])})",
        ]
        lines += [f"  {x}" for x in headline(cell)]
        for m, a in cell["arms"].items():
            t = a["to_target"]
            reach = (
                "never reaches DiLoCo's final + 1 %"
                if t is None
                else f"DiLoCo's final + 1 % ({cell['target_loss']:.4f}) at step {t['step']:.0f}: "
                f"{t['payload_ratio']:.1f}x fewer payload bytes"
            )
            lines.append(
                f"  {m}: final {fmt(a['final'])}"
                + (f", bpb {fmt(a['final_bpb'])}" if a.get("final_bpb") else "")
                + f"; {a['payload_per_sync']:.0f} B payload / {a['wire_per_sync']:.0f} B wire per sync, "
                f"{a['syncs']} syncs; {reach}"
            )
            lines.append(
                f"    tuned: {describe_tuning(cell['tuning']['arms'][m], _setting)}; tuning-seed mean vs eval seeds: "
                + describe_consistency(a["tuning_vs_eval"])
            )
    return "\n".join(lines)


def _setting(s: dict[str, Any]) -> str:
    return " ".join(("nesterov" if v else "heavy-ball") if k == "nesterov" else f"{k}={v:g}" for k, v in s.items())


def plot(record: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    cells = record["figures"]["cells"]
    fig, axes = plt.subplots(1, len(cells), figsize=(6 * len(cells), 4), squeeze=False)
    for ax, f in zip(axes[0], cells.values()):
        for m, r in f["arms"].items():
            pts = [(p[2], p[1]) for p in r["curve"] if p[2] > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{m} {_setting(r['setting'])}")
        ax.axhline(f["target_loss"], ls="--", c="gray", label="DiLoCo final + 1 %")
        ax.set(
            xscale="log",
            xlabel="cumulative payload bytes per replica",
            ylabel="eval loss (seed mean)",
            title=f"N={f['ranks']}",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, png, dpi=120)


# -- the compare preset -----------------------------------------------------------------------------
def compare_preset(record: dict, ranks: int) -> dict[str, Any]:
    """The `decentrain compare` preset of this record's N: its layout and each arm's tuned settings, with what
    stands behind them (conf/compare/<name>.yaml)."""
    c, cell = record["config"], record["figures"]["cells"][f"N={ranks}"]
    behind = (
        f"benchmarks/results/{record['name']}.json @ {record['git_sha'][:10]}: {len(c['tuning_seeds'])} tuning seeds, "
        f"{len(c['eval_seeds'])} eval seeds"
    )
    arms = {}
    for m, a in cell["arms"].items():
        s = a["setting"]
        if m == "diloco":
            ov = [
                f"algorithm.inner_steps={c['diloco_h']}",
                f"algorithm.outer_optimizer.lr={s['lr']}",
                f"algorithm.outer_optimizer.momentum={s['momentum']}",
                f"algorithm.outer_optimizer.nesterov={str(s['nesterov']).lower()}",
            ]
        elif m == "sparseloco":
            ov = [
                f"algorithm.inner_steps={s['h']}",
                f"algorithm.outer_optimizer.lr={s['lr']}",
                f"algorithm.ef_decay={s['ef_decay']}",
            ]
        else:
            continue  # compressed NoLoCo is not one of compare's arms
        arms[m] = {"overrides": ov, "behind": behind}
    mdl = c["model"]
    return {
        "preset": f"bench_n{ranks}",
        "workers": ranks,
        "steps": c["steps"],
        "global_batch_size": c["batch"],
        "micro_batch_size": c["batch"] // ranks,
        "inner_steps": c["diloco_h"],
        "eval_every": STEP_MULTIPLE,
        "scale_overrides": [
            f"data={c['data_name']}",
            f"data.seq_len={c['seq_len']}",
            f"model.hidden_size={mdl['hidden']}",
            f"model.num_layers={mdl['layers']}",
            f"model.num_heads={mdl['heads']}",
            f"model.intermediate_size={mdl['intermediate']}",
            f"model.max_seq_len={c['seq_len']}",
            f"optim.lr={cell['tuning']['inner_lr']}",
        ],
        "arms": arms,
    }


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(
        __doc__.splitlines()[0],
        seeds=8,
        smoke={
            "steps": 40,
            "ranks": [2],
            "seeds": 2,
            "model": "xs",
            "finalists": 1,
            "max_rounds": 1,
            "small_grid": True,
        },
    )
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--model", choices=SIZES, default="s")
    ap.add_argument("--tokens-per-param", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=0, help="0: the fewest steps that read --tokens-per-param")
    ap.add_argument("--tuning-seeds", type=int, nargs="+", default=[100, 101])
    ap.add_argument("--finalists", type=int, default=4, help="grid points run on every tuning seed (0: all)")
    ap.add_argument("--max-rounds", type=int, default=8, help="rounds of each grid's walk")
    ap.add_argument("--small-grid", action="store_true", help="start each grid at its centre only (smoke)")
    ap.add_argument("--diloco-h", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (worker processes)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--name", default="compressed_sync")
    ap.add_argument("--preset-from", metavar="JSON", help="print the compare preset of a record and exit")
    ap.add_argument("--preset-ranks", type=int, default=4)
    add_corpus_flags(ap)
    args = parse(ap, argv)
    if args.preset_from:
        import yaml

        preset = compare_preset(json.loads(Path(args.preset_from).read_text()), args.preset_ranks)
        print(
            "# @package _global_\n# written by python -m benchmarks.compressed_sync --preset-from "
            + args.preset_from
            + "\n"
            + yaml.safe_dump(preset, sort_keys=False, width=120)
        )
        return
    model, seq_len, batch = SIZES[args.model], 64, 32
    params = model_params(model, seq_len)
    steps = args.steps or plan_steps(params, batch * seq_len, args.tokens_per_param)
    spaces = {
        m: (
            {k: Axis(a.ladder, (a.start[len(a.start) // 2],), a.ordered) for k, a in sp.items()}
            if args.small_grid
            else sp
        )
        for m, sp in {**SPACES, "inner": INNER_SPACE}.items()
    }
    data = recipe_sections([f"data={args.data}", *args.override])["data"]
    corpus = corpus_facts(data, model, seq_len)
    fixed = {"topk": 64, "bits": 2, "state_topk": 32, "state_bits": 4, "anchor_every": 10, "noloco_momentum": 0.5}
    config = {
        "steps": steps,
        "ranks": args.ranks,
        "model_size": args.model,
        "model": model,
        "params": params,
        "seq_len": seq_len,
        "batch": batch,
        "data_name": args.data,
        "overrides": args.override,
        "data": data,
        "corpus": corpus,
        "tuning_seeds": args.tuning_seeds,
        "eval_seeds": seed_list(args.seeds),
        "finalists": args.finalists or None,
        "max_rounds": args.max_rounds,
        "diloco_h": args.diloco_h,
        "fixed": fixed,
        "methods": args.methods,
        "spaces": {
            m: {k: [list(a.ladder), list(a.start), a.ordered] for k, a in sp.items()} for m, sp in spaces.items()
        },
        "decision_rules": preregister(CACHE_DIR, args.name, RULES, args.fresh),
    }  # fixed before any run
    harness = Harness(args.name, __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    # the corpus hash rides in every job: a run cached on other text is never reused
    shared = {
        "steps": steps,
        "model": model,
        "seq_len": seq_len,
        "batch": batch,
        "data": data,
        "corpus_hash": corpus["hash"],
        "warmup": 20,
        "eval_every": STEP_MULTIPLE,
        "eval_seqs": 32,
        "fixed": fixed,
        "diloco_h": args.diloco_h,
    }
    plan = {
        "methods": args.methods,
        "spaces": spaces,
        "tuning_seeds": args.tuning_seeds,
        "finalists": args.finalists or None,
        "max_rounds": args.max_rounds,
        "parallel": args.parallel,
    }
    cells: dict[str, Any] = {}
    for n in args.ranks:  # one N after the other: a run cut short still has a whole N
        tuned = tune(harness, shared, n, plan)
        jobs = [
            _job(shared, n, m, t["winner"], s, tuned["inner_lr"])
            for m, t in tuned["arms"].items()
            for s in config["eval_seeds"]
        ]
        results = harness.run_jobs(jobs, train_run, desc=f"eval seeds N={n}", parallel=args.parallel)
        runs: dict[str, list[dict[str, Any]]] = {}
        for j, r in zip(jobs, results):
            runs.setdefault(j["method"], []).append({**r, "h": j["h"]})
        cells[f"N={n}"] = {**figures_for(n, tuned, runs, config["decision_rules"]), "tuning": tuned}
        logged = {json.dumps(r["corpus"], sort_keys=True) for rs in runs.values() for r in rs if r.get("corpus")}
        figures = {
            "cells": cells,
            "tokens_per_param": steps * batch * seq_len / params,
            "epochs": steps * batch * seq_len / corpus["train_tokens"],
            "corpus": corpus if len(logged) <= 1 else {"name": "mixed", "hash": None},
        }
        figures["unmet"] = sorted(
            set(
                x
                for c in cells.values()
                for x in unmet(
                    c["tuning"]["arms"],
                    args.tuning_seeds,
                    config["eval_seeds"],
                    figures["tokens_per_param"],
                    figures["corpus"],
                )
            )
        )
        paths = harness.write(figures, text, plot)
    print(paths["txt"].read_text())


if __name__ == "__main__":
    main()
