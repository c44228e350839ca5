"""One GPU: decentrain's training loop against a bare compiled torch loop, side by side.

Same model (the 125M Llama of NoLoCo: hidden 768, 12 layers, FFN 2048, byte vocab), same
batch, precision (fp32 master weights + bf16 autocast by default), compile scope and
fused AdamW. Each seed runs the bare loop, then decentrain's `Trainer.fit` (DDP on one
rank, the README's path); both read the loss on the host once per window of steps, so
each window's wall time covers its device work. The first window (compilation) is
not counted. Figures: ms/step, tokens/s, MFU, peak memory, and the per-seed ratio
decentrain / bare (targets: ratio <= 1.05, MFU >= 35% on an H100/H200 at seq 1024).
Both loops call the model with use_cache=False (a KV cache per forward made compile=blocks
recompile per layer until the recompile limit) and run fp32 matmuls on TF32 (train.tf32).

MFU = (6 x non-embedding params + 12 x layers x hidden x seq) x tokens/s / peak, as
core/metrics.py states it; peak from core.metrics.PEAK_FLOPS by GPU name (--peak-flops overrides).

    python -m benchmarks.gpu_step                      # writes results/gpu_step.{json,png,txt}
    python -m benchmarks.gpu_step --micro-batch 32 --compile model
    python -m benchmarks.gpu_step --smoke              # tiny model, a few steps, any device; writes nothing

Without CUDA (and without --smoke) it prints why and exits 0.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.harness import Harness, bench_parser, own_flags, parse, save_figure
from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.engines import build_optimizer
from decentrain.algorithms.pretraining.precision import (apply_compile, autocast, resolve_precision, set_tf32,
                                                         weight_dtype)
from decentrain.algorithms.pretraining.trainer import Trainer, model_flops_per_token, seed_everything
from decentrain.config import TrainConfig, config_from_dict
from decentrain.core.metrics import MetricsLogger, mfu, peak_flops, read_jsonl
from decentrain.core.world import init_world
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import build_model, build_tokenizer


@dataclass
class BenchConfig:
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 2048
    seq_len: int = 1024
    micro_batch: int = 16
    accum: int = 1
    precision: str = "bf16_autocast"
    compile: str = "blocks"
    window: int = 10  # steps between host reads; the first window is warm-up (compilation)
    windows: int = 3  # measured windows per seed and loop
    seeds: int = 3
    peak_flops: float | None = None
    smoke: bool = False

    @property
    def steps(self) -> int:
        return self.window * (1 + self.windows)


def train_config(b: BenchConfig) -> TrainConfig:
    return config_from_dict({
        "algorithm": {"name": "ddp"},
        "model": {"name": "llama_125m", "hidden_size": b.hidden_size, "num_layers": b.num_layers, "num_heads": b.num_heads,
                  "intermediate_size": b.intermediate_size, "max_seq_len": b.seq_len},
        "data": {"seq_len": b.seq_len, "max_bytes_per_domain": 400_000},
        "train": {"steps": b.steps, "global_batch_size": b.micro_batch * b.accum, "micro_batch_size": b.micro_batch,
                  "eval_every": 10**6, "checkpoint_every": 10**6, "eval_batches": 1, "precision": b.precision,
                  "compile": b.compile, "device": "auto"},
        "optim": {"warmup_steps": 1},
        "logger": {"console": False, "jsonl": True, "progress": False, "log_every": b.window, "peak_flops": b.peak_flops},
        "launcher": {"name": "torchrun", "nproc_per_node": None},
    })


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(cfg: TrainConfig, b: BenchConfig, blocks: torch.Tensor, device: torch.device, seed: int) -> list[float]:
    """The loop a user writes by hand: compiled model (no KV cache), fused AdamW, autocast, TF32;
    seconds per step of each window."""
    seed_everything(seed)
    precision = resolve_precision(b.precision, device)
    set_tf32(device, cfg.train.tf32)  # as the Trainer does (process-wide: the same for both loops)
    model = build_model(cfg.model).to(device=device, dtype=weight_dtype(precision))
    opt, sched = build_optimizer(model, cfg.optim, cfg.train.steps)
    apply_compile(model, b.compile)
    gen = torch.Generator().manual_seed(seed)
    per_step, tick = [], None
    for step in range(b.steps):
        if step % b.window == 0:
            tick = time.perf_counter()
        batch = blocks[torch.randint(len(blocks), (b.micro_batch * b.accum,), generator=gen)].to(device, non_blocking=True)
        total = torch.zeros((), device=device)
        for micro in batch.split(b.micro_batch):
            with autocast(precision, device):
                loss = model(input_ids=micro, labels=micro, use_cache=False).loss / b.accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % b.window == 0:
            total.item()  # the one host read per window, as decentrain's loop does at log steps
            per_step.append((time.perf_counter() - tick) / b.window)
    return per_step[1:]


def decentrain_loop(cfg: TrainConfig, world, corpus, run_dir: Path, seed: int) -> list[float]:
    """`Trainer.fit` with DDP on one rank; seconds per step of each window, from its own perf/step_ms log."""
    seed_everything(seed)
    model = build_model(cfg.model)
    trainer = Trainer(cfg.train, world, ALGORITHMS.get("ddp")(cfg.algorithm, world), model, corpus, run_dir,
                      engine=cfg.engine, optim=cfg.optim, logger=cfg.logger)
    logger = MetricsLogger(cfg.logger, run_dir, world.rank)
    trainer.fit(logger)
    logger.close()
    rows = [r["perf/step_ms"] / 1e3 for r in read_jsonl(run_dir / "metrics.jsonl") if "perf/step_ms" in r]
    return rows[1:]


def summarize(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def measure(b: BenchConfig) -> dict:
    world = init_world(device="auto")
    cfg = train_config(b)
    device = world.device
    corpus = build_corpus(cfg.data, build_tokenizer(cfg.model))
    blocks = corpus.train_blocks()
    flops_tok = model_flops_per_token(build_model(cfg.model), b.seq_len)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(name, b.peak_flops)
    tokens = b.micro_batch * b.accum * b.seq_len
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(b.seeds):
            row = {"seed": seed}
            for loop in ("bare", "decentrain"):
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                _sync(device)
                torch._dynamo.reset()  # each loop compiles its own model: count its graphs alone
                torch._dynamo.utils.counters.clear()
                if loop == "bare":
                    secs = bare_loop(cfg, b, blocks, device, seed)
                else:
                    secs = decentrain_loop(cfg, world, corpus, Path(tmp) / f"seed{seed}", seed)
                step_s = statistics.median(secs)
                row[f"{loop}_ms"] = step_s * 1e3
                row[f"{loop}_tokens_per_s"] = tokens / step_s
                row[f"{loop}_mfu"] = mfu(tokens / step_s, flops_tok, peak) if peak else None
                # compile=blocks should give <= 2 graphs (train + eval); more means recompiles
                row[f"{loop}_graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
                row[f"{loop}_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            row["ratio"] = row["decentrain_ms"] / row["bare_ms"]
            rows.append(row)
            print(f"seed {seed}: bare {row['bare_ms']:.1f} ms, decentrain {row['decentrain_ms']:.1f} ms, "
                  f"ratio {row['ratio']:.3f}", flush=True)
    world.shutdown()
    out = {"gpu": name, "peak_flops": peak, "flops_per_token": flops_tok, "tokens_per_step": tokens, "seeds": rows}
    for key in ("bare_ms", "decentrain_ms", "ratio", "bare_mfu", "decentrain_mfu"):
        vals = [r[key] for r in rows if r[key] is not None]
        if vals:
            out[key] = summarize(vals)
    return out


def text_table(fig: dict) -> str:
    lines = [f"gpu_step on {fig['gpu']} (peak {fig['peak_flops'] or float('nan'):.3g} FLOP/s, "
             f"{fig['tokens_per_step']} tokens/step)", f"{'loop':>11} | {'ms/step':>15} | {'MFU':>15}"]
    for loop in ("bare", "decentrain"):
        ms, m = fig[f"{loop}_ms"], fig.get(f"{loop}_mfu")
        mfu_txt = f"{m['mean']:.1%} ± {m['std']:.1%}" if m else "n/a"
        lines.append(f"{loop:>11} | {ms['mean']:7.2f} ± {ms['std']:5.2f} | {mfu_txt:>15}")
    r = fig["ratio"]
    lines.append(f"decentrain / bare = {r['mean']:.3f} ± {r['std']:.3f} (target <= 1.05); MFU target >= 35% (125M, seq 1024, H100/H200)")
    graphs = [(r["bare_graphs"], r["decentrain_graphs"]) for r in fig["seeds"] if "bare_graphs" in r]
    if graphs:
        lines.append(f"compiled graphs per seed (bare, decentrain): {graphs}")
    return "\n".join(lines)


def plot(fig: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, ax = plt.subplots(figsize=(6, 3.5))
    loops = ["bare", "decentrain"]
    means = [fig[f"{x}_ms"]["mean"] for x in loops]
    stds = [fig[f"{x}_ms"]["std"] for x in loops]
    ax.bar(["bare compiled torch", "decentrain Trainer"], means, yerr=stds, capsize=4)
    ax.set_ylabel("ms per step (mean ± std over seeds)")
    ax.set_title(f"{fig['gpu']}: ratio {fig['ratio']['mean']:.3f}")
    f.tight_layout()
    save_figure(f, out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, seeds=BenchConfig.seeds)
    for name in ("micro_batch", "accum", "seq_len", "window", "windows"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(BenchConfig, name))
    p.add_argument("--precision", default=BenchConfig.precision, choices=["fp32", "bf16_autocast", "bf16"])
    p.add_argument("--compile", default=BenchConfig.compile, choices=["none", "model", "blocks"])
    p.add_argument("--peak-flops", type=float, default=None, help="FLOP/s of the GPU (default: looked up by name)")
    args = parse(p, argv)  # --smoke: tiny model, 2 short windows, any device; writes no results
    b = BenchConfig(**own_flags(args), smoke=args.smoke)
    if b.smoke:
        b.hidden_size, b.num_layers, b.num_heads, b.intermediate_size = 32, 2, 2, 64
        b.seq_len, b.micro_batch, b.window, b.windows, b.seeds, b.compile = min(b.seq_len, 64), 2, 2, 2, 2, "none"
    elif not torch.cuda.is_available():
        print("gpu_step: no CUDA device here; nothing measured (run it on a GPU machine, or --smoke to check the code path)")
        return 0
    hz = None if b.smoke else Harness("gpu_step", __file__, asdict(b), allow_dirty=args.allow_dirty, fresh=args.fresh)
    fig = measure(b)
    print(text_table(fig))
    if hz is None:
        return 0
    hz.write(fig, lambda rec: text_table(rec["figures"]), lambda rec, png: plot(rec["figures"], png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
