"""compressed_sync: eval loss against bytes sent, uncompressed DiLoCo vs SparseLoCo.

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
The headline ratio is bytes to first reach within 1 % of DiLoCo's final eval loss
(seed-mean curves, evaluated every H steps, i.e. right after each sync).

Departures from the SparseLoCo paper's protocol, named: a tiny model (not 512M), a few
hundred steps, N replicas on one CPU, hyperparameters not tuned here (DiLoCo at its
paper's 0.7 / 0.9 Nesterov, SparseLoCo at its 1.0 / β = 0.95), chunks over the flat
parameter vector (see common/compression.py).

    python -m benchmarks.compressed_sync                           # 3 seeds (~40 min on 2 shared cores)
    python -m benchmarks.compressed_sync --seeds 1 --steps 40 --allow-dirty   # smoke
"""

from __future__ import annotations

import argparse
import os
import tempfile
import traceback
from pathlib import Path
from typing import Any

from benchmarks.harness import Harness, fmt, header, mean_std, seeds_arg

METHODS = ("diloco", "sparseloco")


def _algorithm(job: dict[str, Any]) -> dict[str, Any]:
    if job["method"] == "diloco":
        return {"name": "diloco", "inner_steps": job["h"], "outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}
    return {"name": "sparseloco", "inner_steps": job["h"], "outer_lr": job["sl_outer_lr"], "ef_decay": job["ef_decay"],
            "chunk_size": job["chunk"], "topk": job["topk"], "bits": job["bits"]}


def _config(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "algorithm": _algorithm(job),
        "model": {"hidden_size": job["hidden"], "num_layers": job["layers"], "num_heads": job["heads"],
                  "intermediate_size": job["intermediate"], "max_seq_len": job["seq_len"]},
        "data": {"seq_len": job["seq_len"], "max_bytes_per_domain": job["max_bytes"]},
        "optim": {"lr": job["inner_lr"], "warmup_steps": job["warmup"]},
        "train": {"steps": job["steps"], "global_batch_size": job["batch"], "micro_batch_size": job["batch"] // job["ranks"],
                  "eval_every": job["h"], "eval_batches": job["eval_batches"], "checkpoint_every": 10**6,
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
    curves = {}
    for m, runs in results.items():
        steps = [s for s, _ in runs[0]["evals"]]
        curves[m] = [(s, sum(dict(r["evals"])[s] for r in runs) / len(runs)) for s in steps]
    final = {m: mean_std([r["evals"][-1][1] for r in runs]) for m, runs in results.items()}
    target = 1.01 * final["diloco"]["mean"]
    out: dict[str, Any] = {"final_eval_loss": final, "target_loss": target, "numel": results["diloco"][0]["numel"],
                           "curves": {m: [[s, loss, sum(_cumulative_at(r, "payload_bytes", s) for r in results[m]) / len(results[m])]
                                          for s, loss in c] for m, c in curves.items()}}
    per_sync = {m: results[m][0]["payload_bytes"][0] for m in results}
    out["payload_ratio_per_sync"] = per_sync["diloco"] / per_sync["sparseloco"]
    out["wire_ratio_per_sync"] = results["diloco"][0]["wire_bytes"][0] / results["sparseloco"][0]["wire_bytes"][0]
    for key in ("payload_bytes", "wire_bytes"):
        to = {m: _bytes_to(curves[m], results[m], key, target) for m in results}
        out[f"{key}_to_target"] = to
        out[f"{key}_ratio_to_target"] = to["diloco"] / to["sparseloco"] if to["sparseloco"] else None
    # paired per-seed final-loss difference (same seed, same data order)
    diffs = [s["evals"][-1][1] - d["evals"][-1][1] for d, s in zip(results["diloco"], results["sparseloco"])]
    out["final_loss_diff_sparseloco_minus_diloco"] = mean_std(diffs)
    return out


def text(record: dict) -> str:
    f, c = record["figures"], record["config"]
    lines = [header(record), "",
             f"{c['ranks']} replicas, {f['numel']:,} parameters, H={c['h']}, {c['steps']} steps, {c['seeds']} seed(s); "
             f"SparseLoCo top-{c['topk']}/{c['chunk']} ({100 * c['topk'] / c['chunk']:.2f} %), {c['bits']}-bit, β={c['ef_decay']}",
             f"final eval loss: DiLoCo {fmt(f['final_eval_loss']['diloco'])}, SparseLoCo {fmt(f['final_eval_loss']['sparseloco'])}; "
             f"paired difference (SparseLoCo − DiLoCo) {fmt(f['final_loss_diff_sparseloco_minus_diloco'])}",
             f"bytes per sync and replica: payload {f['payload_ratio_per_sync']:.1f}x fewer, wire (ring, N={c['ranks']}) "
             f"{f['wire_ratio_per_sync']:.1f}x fewer",
             f"target: within 1 % of DiLoCo's final loss = {f['target_loss']:.4f}"]
    for key in ("payload_bytes", "wire_bytes"):
        to, ratio = f[f"{key}_to_target"], f[f"{key}_ratio_to_target"]
        if ratio is None:
            lines.append(f"{key} to target: SparseLoCo never reached it; DiLoCo {to['diloco'] / 1e6:.2f} MB")
        else:
            lines.append(f"{key} to target: DiLoCo {to['diloco'] / 1e6:.3f} MB, SparseLoCo {to['sparseloco'] / 1e6:.4f} MB "
                         f"-> {ratio:.1f}x fewer (target ≥ 50x: {'met' if ratio >= 50 else 'not met'})")
    return "\n".join(lines)


def plot(record: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = record["figures"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, curve in f["curves"].items():
        pts = [(b, loss) for _, loss, b in curve if b > 0]
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
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--h", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--name", default="compressed_sync")
    args = ap.parse_args(argv)
    config = {"steps": args.steps, "h": args.h, "ranks": args.ranks, "seeds": args.seeds, "hidden": 128, "layers": 4,
              "heads": 4, "intermediate": 352, "seq_len": 64, "max_bytes": 200_000, "batch": 16, "inner_lr": 1e-3,
              "warmup": 20, "eval_batches": 4, "topk": args.topk, "chunk": args.chunk, "bits": args.bits,
              "ef_decay": 0.95, "sl_outer_lr": 1.0}
    harness = Harness(args.name, __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh)
    jobs = [{**config, "method": m, "seed": s} for m in METHODS for s in range(args.seeds)]
    runs = harness.run_jobs(jobs, train_run)
    results = {m: [r for j, r in zip(jobs, runs) if j["method"] == m] for m in METHODS}
    paths = harness.write(figures_from(results), text, plot)
    print(paths["txt"].read_text())


if __name__ == "__main__":
    main()
