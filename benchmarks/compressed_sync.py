"""compressed_sync: eval loss against bytes sent: DiLoCo, SparseLoCo, NoLoCo and compressed NoLoCo.

Each run is the library's own pre-training job (`run_pretraining`, the function behind
`decentrain`) on N local gloo processes, a small Llama on the offline corpus, CPU. The
two methods share everything but `algorithm`: same model, data, seed, inner AdamW, H.

Bytes are counted per replica and per sync, two ways:
  - payload: what one replica contributes. SparseLoCo logs it (`outer/payload_bytes`,
    the encoded message, header included); DiLoCo's is the dense fp32 pseudo-gradient,
    4·numel bytes (diloco.py logs no byte count, so it is computed from the model).
  - wire: what one rank transmits. SparseLoCo logs it (`outer/bytes_sent`: a ring
    all-gather forwards each of the N−1 other blocks once, plus 8-byte size
    announcements); DiLoCo's ring all-reduce sends 2·(N−1)/N·4·numel.
  NoLoCo (`noloco`) sends its fast weights to its one partner: 4·numel + 8 bytes (its pace)
    per sync, payload and wire alike; compressed NoLoCo (`noloco_c`, algorithm.compression,
    noloco/compressed_gossip.py) logs both (`outer/payload_bytes`: its two messages;
    `outer/bytes_sent`: those to its partner plus, every K rounds, its share of the
    anchor all-gather).
Variants (`--variants method:H ...`): DiLoCo at H=20 (the baseline), SparseLoCo and
compressed NoLoCo at the same H or at H=5 (same compute, 4x the syncs, each ~70-110x
smaller), NoLoCo uncompressed. NoLoCo's eval loss is rank 0's replica (replicas differ).
The headline ratio is bytes to first reach within 1 % of DiLoCo's final eval loss
(seed-mean curves, evaluated every max(H, 20) steps, right after a sync).

Departures from the SparseLoCo paper's protocol, named: a 0.15M-parameter model (not 512M),
200 steps on three offline domains (~10-40 syncs where the paper has thousands), N replicas on one CPU, hyperparameters not tuned here (DiLoCo at its
paper's 0.7 / 0.9 Nesterov, SparseLoCo at its 1.0 / β = 0.95, NoLoCo compressed or not at
NoLoCo's 0.7 / 0.5), chunks over the flat parameter vector (see common/compression.py);
NoLoCo at N=2 always pairs the same two replicas (no gossip mixing); NoLoCo runs without
the heartbeat stall rule (`stall_s=null`: a clean run on a loaded box must not drop rounds).

    python -m benchmarks.compressed_sync                           # 3 seeds (~40 min on 2 idle cores)
    python -m benchmarks.compressed_sync --seeds 1 --steps 160 --parallel 3   # what results/ holds (a loaded box)
    python -m benchmarks.compressed_sync --seeds 1 --steps 40 --allow-dirty   # smoke
    python -m benchmarks.compressed_sync --seeds 3 --steps 160 --parallel 3 \
        --variants diloco:20 sparseloco:5 noloco:20 noloco_c:20 noloco_c:5      # what results/ holds now (~30 min, loaded box)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import traceback
from pathlib import Path
from typing import Any

from benchmarks.harness import Harness, fmt, header, mean_std, seeds_arg

METHODS = ("diloco", "sparseloco", "noloco", "noloco_c")


def _algorithm(job: dict[str, Any]) -> dict[str, Any]:
    if job["method"] == "diloco":
        return {"name": "diloco", "inner_steps": job["h"], "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}
    if job["method"] in ("noloco", "noloco_c"):
        algo = {"name": "noloco", "inner_steps": job["h"], "outer_lr": 0.7, "outer_momentum": 0.5, "stall_s": None}
        if job["method"] == "noloco_c":
            algo["compression"] = {"enabled": True, "ef_decay": job["ef_decay"], "chunk_size": job["chunk"], "topk": job["topk"],
                                   "bits": job["bits"], "state_topk": job["state_topk"], "state_bits": job["state_bits"],
                                   "anchor_every": job["anchor_every"]}
        return algo
    return {"name": "sparseloco", "inner_steps": job["h"], "outer_lr": job["sl_outer_lr"], "ef_decay": job["ef_decay"],
            "chunk_size": job["chunk"], "topk": job["topk"], "bits": job["bits"]}


def _config(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "algorithm": _algorithm(job),
        "model": {"hidden_size": job["hidden"], "num_layers": job["layers"], "num_heads": job["heads"],
                  "intermediate_size": job["intermediate"], "max_seq_len": job["seq_len"]},
        "data": {"seq_len": job["seq_len"], "max_bytes_per_domain": job["max_bytes"], "domains": job["domains"]},
        "optim": {"lr": job["inner_lr"], "warmup_steps": job["warmup"]},
        "train": {"steps": job["steps"], "global_batch_size": job["batch"], "micro_batch_size": job["batch"] // job["ranks"],
                  "eval_every": max(job["h"], 20), "eval_batches": job["eval_batches"], "checkpoint_every": 10**6,
                  "threads": 1, "seed": job["seed"], "device": "cpu"},
        "logger": {"progress": False, "log_every": job["h"]},
        "launcher": {"name": "torchrun", "nproc_per_node": None},
    }


def _rank_entry(rank: int, n: int, port: int, job: dict[str, Any], run_dir: str, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n), OMP_NUM_THREADS="1")
    import torch.distributed as dist

    from decentrain.algorithms.common.pretrain import run_pretraining
    from decentrain.config import config_from_dict
    from decentrain.core.world import init_world

    world = init_world(backend="gloo", timeout_s=600, threads=1)
    try:
        run_pretraining(config_from_dict(_config(job)), world, Path(run_dir))
        queue.put((rank, "ok"))
    except BaseException:
        queue.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train_run(job: dict[str, Any]) -> dict[str, Any]:
    """One multi-process run; returns rank 0's eval curve and per-sync byte counts."""
    import socket

    import torch.multiprocessing as mp

    from decentrain.core.metrics import read_jsonl
    from decentrain.models.factory import ModelConfig, build_model, build_tokenizer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="compressed_sync_") as run_dir:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_rank_entry, args=(r, job["ranks"], port, job, run_dir, queue)) for r in range(job["ranks"])]
        for p in procs:
            p.start()
        errors = [msg for _, msg in (queue.get(timeout=3600) for _ in procs) if msg != "ok"]
        for p in procs:
            p.join(timeout=60)
        if errors:
            raise RuntimeError(errors[0])
        rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    mc = ModelConfig(**_config(job)["model"])
    numel = sum(p.numel() for p in build_model(mc, build_tokenizer(mc)).parameters())
    n = job["ranks"]
    evals = [(r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r]
    if job["method"] == "diloco":
        syncs = [r["step"] for r in rows if "outer/pseudo_grad_norm" in r]
        payload = [4.0 * numel] * len(syncs)
        wire = [2.0 * (n - 1) / n * 4 * numel] * len(syncs)
    elif job["method"] == "noloco":
        sync_rows = [r for r in rows if "outer/partner_missed" in r]
        syncs = [r["step"] for r in sync_rows]
        payload = wire = [4.0 * numel + 8] * len(syncs)  # fast weights + the 2-float pace, to one partner
        if any(r["outer/partner_missed"] for r in sync_rows):
            raise RuntimeError("a partner was missed in a clean run")
    else:
        sync_rows = [r for r in rows if "outer/bytes_sent" in r]
        syncs = [r["step"] for r in sync_rows]
        payload = [r["outer/payload_bytes"] for r in sync_rows]
        wire = [r["outer/bytes_sent"] for r in sync_rows]
        if any(r["outer/payload_dropped"] for r in sync_rows):
            raise RuntimeError("a payload was dropped in a clean run")
    return {"numel": numel, "evals": evals, "syncs": syncs, "payload_bytes": payload, "wire_bytes": wire}


def _cumulative_at(res: dict[str, Any], key: str, step: int) -> float:
    return float(sum(b for s, b in zip(res["syncs"], res[key]) if s <= step))


def _bytes_to(curve: list[tuple[int, float]], results: list[dict[str, Any]], key: str, target: float) -> float | None:
    """Seed-mean cumulative bytes at the first eval step whose seed-mean loss is <= target."""
    for step, loss in curve:
        if loss <= target:
            return sum(_cumulative_at(r, key, step) for r in results) / len(results)
    return None


def figures_from(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant (label -> its seeds' runs, "diloco" the baseline): final loss, bytes, ratios to DiLoCo."""
    curves = {}
    for m, runs in results.items():
        steps = [s for s, _ in runs[0]["evals"]]
        curves[m] = [(s, sum(dict(r["evals"])[s] for r in runs) / len(runs)) for s in steps]
    base = results["diloco"]
    target = 1.01 * mean_std([r["evals"][-1][1] for r in base])["mean"]
    out: dict[str, Any] = {"target_loss": target, "numel": base[0]["numel"], "variants": {}}
    for m, runs in results.items():
        v: dict[str, Any] = {
            "final_eval_loss": mean_std([r["evals"][-1][1] for r in runs]),
            "curve": [[s, loss, sum(_cumulative_at(r, "payload_bytes", s) for r in runs) / len(runs)] for s, loss in curves[m]],
            "payload_ratio_per_sync": base[0]["payload_bytes"][0] / runs[0]["payload_bytes"][0],
            "wire_ratio_per_sync": base[0]["wire_bytes"][0] / runs[0]["wire_bytes"][0],
            "total_payload_bytes": sum(_cumulative_at(r, "payload_bytes", 10**12) for r in runs) / len(runs),
        }
        for key in ("payload_bytes", "wire_bytes"):
            to, to_base = _bytes_to(curves[m], runs, key, target), _bytes_to(curves["diloco"], base, key, target)
            v[f"{key}_to_target"] = to
            v[f"{key}_ratio_to_target"] = to_base / to if to else None
        # paired per-seed final-loss difference (same seed, same data order)
        v["final_loss_diff_vs_diloco"] = mean_std([r["evals"][-1][1] - d["evals"][-1][1] for d, r in zip(base, runs)])
        out["variants"][m] = v
    return out


def text(record: dict) -> str:
    f, c = record["figures"], record["config"]
    lines = [header(record), "",
             f"{c['ranks']} replicas, {f['numel']:,} parameters, {c['steps']} steps, {c['seeds']} seed(s); "
             f"SparseLoCo top-{c['topk']}/{c['chunk']} ({100 * c['topk'] / c['chunk']:.2f} %), {c['bits']}-bit, β={c['ef_decay']}; "
             f"compressed NoLoCo: the same for Δ, top-{c.get('state_topk')}/{c['chunk']} {c.get('state_bits')}-bit for φ − A, "
             f"re-anchor every {c.get('anchor_every')} rounds",
             f"target: within 1 % of DiLoCo's final eval loss = {f['target_loss']:.4f}", ""]
    for m, v in f["variants"].items():
        lines.append(f"{m}: final eval loss {fmt(v['final_eval_loss'])} (paired vs DiLoCo {fmt(v['final_loss_diff_vs_diloco'])}); "
                     f"per sync {v['payload_ratio_per_sync']:.1f}x fewer payload bytes, {v['wire_ratio_per_sync']:.1f}x fewer wire "
                     f"bytes (ring, N={c['ranks']}); whole run {v['total_payload_bytes'] / 1e6:.3f} MB payload per replica")
        for key in ("payload_bytes", "wire_bytes"):
            to, ratio = v[f"{key}_to_target"], v[f"{key}_ratio_to_target"]
            if to is None:
                lines.append(f"  {key} to target: never reached")
            else:
                lines.append(f"  {key} to target: {to / 1e6:.4f} MB -> {ratio:.1f}x fewer than DiLoCo"
                             + ("" if m == "diloco" else f" (target ≥ 50x: {'met' if ratio >= 50 else 'not met'})"))
    return "\n".join(lines)


def plot(record: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = record["figures"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, v in f["variants"].items():
        pts = [(b, loss) for _, loss, b in v["curve"] if b > 0]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
    ax.axhline(f["target_loss"], ls="--", c="gray", label="DiLoCo final + 1 %")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative payload bytes per replica")
    ax.set_ylabel("eval loss (seed mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    seeds_arg(ap)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--variants", nargs="+", default=["diloco:20", "sparseloco:20", "sparseloco:5"],
                    help="method:H pairs; diloco:H is the baseline (the first diloco one)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--state-topk", type=int, default=32, help="compressed NoLoCo: k' of the φ − A message")
    ap.add_argument("--state-bits", type=int, default=4)
    ap.add_argument("--anchor-every", type=int, default=10)
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (each is --ranks processes)")
    ap.add_argument("--name", default="compressed_sync")
    args = ap.parse_args(argv)
    # a 0.15M-parameter Llama on three domains: ~20 min for all 6 runs on 2 cores shared with other jobs
    config = {"steps": args.steps, "variants": args.variants, "ranks": args.ranks, "seeds": args.seeds, "hidden": 64, "layers": 2,
              "heads": 2, "intermediate": 176, "seq_len": 64, "max_bytes": 100_000,
              "domains": ["python_stdlib", "python_docs", "licenses"], "batch": 16, "inner_lr": 1e-3,
              "warmup": 20, "eval_batches": 4, "topk": args.topk, "chunk": args.chunk, "bits": args.bits,
              "ef_decay": 0.95, "sl_outer_lr": 1.0, "state_topk": args.state_topk, "state_bits": args.state_bits,
              "anchor_every": args.anchor_every}
    harness = Harness(args.name, __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh)
    variants = [(v.split(":")[0], int(v.split(":")[1])) for v in args.variants]
    if variants[0][0] != "diloco" or any(m not in METHODS for m, _ in variants):
        raise SystemExit(f"--variants must start with diloco:H and use methods {list(METHODS)}")
    shared = {k: v for k, v in config.items() if k != "variants"}
    jobs = [{**shared, "method": m, "h": h, "seed": s} for s in range(args.seeds) for m, h in variants]  # seed-major
    runs = harness.run_jobs(jobs, train_run, parallel=args.parallel)
    labels = ["diloco" if i == 0 else f"{m} H={h}" for i, (m, h) in enumerate(variants)]
    results = {lab: [r for j, r in zip(jobs, runs) if (j["method"], j["h"]) == v] for lab, v in zip(labels, variants)}
    paths = harness.write(figures_from(results), text, plot)
    print(paths["txt"].read_text())


if __name__ == "__main__":
    main()
