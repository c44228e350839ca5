"""One GPU: decentrain's training loop against a bare compiled torch loop, window by window, until the
95 % interval of their step-time ratio is narrower than ±3 %.

Same model (the 125M Llama of NoLoCo: hidden 768, 12 layers, FFN 2048, byte vocab), same batch,
precision (fp32 master weights + bf16 autocast by default), compile scope and fused AdamW. Both loops
live on the GPU at once and take turns: a window of `--window` steps of decentrain's `Trainer.fit` (DDP
on one rank, the README's path), then a window of the bare loop, then decentrain again. Interleaving
puts both loops under the same clocks, temperature and neighbours, so the paired window ratio
decentrain / bare is far steadier than the ratio of two runs one after the other (two H200 runs of
three sequential windows per seed gave per-seed ratios of 0.80 to 1.17). Each loop reads its loss on
the host once per window (the read waits for the window's work), and each window's time is that
loop's own: decentrain's from its `perf/step_ms` log (core.metrics.Throughput), the bare loop's from
the clock around its window. The first `--warmup-windows` of each loop (compilation) are not counted.

The interval: the t interval of the mean log ratio over the measured windows, exponentiated (a
geometric mean ratio; symmetric in which loop is on top). Windows are added until its upper half-width
is at most `--target` (3 %) with at least `--min-windows`, or `--max-windows` or `--budget-s` runs out;
the record says which. Stopping on the interval makes the 95 % slightly optimistic (a sequential
test); `--min-windows` limits how early it can stop.

Targets: ratio <= 1.05, MFU >= 40 % on an H100/H200 at seq 1024 (--compile model and a larger
--micro-batch are the levers the library exposes; both loops always run the same settings).
Both loops call the model with use_cache=False and run fp32 matmuls on TF32 (train.tf32).

MFU = (6 x non-embedding params + 12 x layers x hidden x seq) x tokens/s / peak, as
core/metrics.py states it; peak from core.metrics.PEAK_FLOPS by GPU name (--peak-flops overrides).

    python -m benchmarks.gpu_step                      # writes results/gpu_step.{json,png,txt}
    python -m benchmarks.gpu_step --micro-batch 32 --compile model
    python -m benchmarks.gpu_step --smoke              # tiny model, a few windows, any device; writes nothing

Without CUDA (and without --smoke) it prints why and exits 0.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.harness import Harness, bench_parser, own_flags, parse, save_figure
from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.engines import build_optimizer
from decentrain.algorithms.pretraining.precision import (
    apply_compile,
    autocast,
    resolve_precision,
    set_tf32,
    weight_dtype,
)
from decentrain.algorithms.pretraining.trainer import Trainer, model_flops_per_token, seed_everything
from decentrain.config import TrainConfig, config_from_dict
from decentrain.core.metrics import MetricsLogger, mfu, peak_flops
from decentrain.core.world import init_world
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import build_model, build_tokenizer

DOMAINS = ["python_stdlib", "python_docs"]  # tokens to train on, from any CPython (no reasoning_gym needed)


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
    window: int = 10  # steps between host reads: one window of one loop
    warmup_windows: int = 2  # per loop, not counted (compilation, the allocator's first growth)
    min_windows: int = 8  # measured window pairs before the interval may stop the run
    max_windows: int = 60
    target: float = 0.03  # stop once the 95 % interval of the ratio lies within +-target of its centre
    budget_s: float = 110.0  # wall clock of the measurement, compilation included: no window starts after it
    seeds: int = 1  # each seed a fresh pair of models; the interval pools every seed's windows
    peak_flops: float | None = None
    smoke: bool = False

    @property
    def steps(self) -> int:  # a ceiling: the Trainer stops when the interval decides
        return self.window * (self.warmup_windows + self.max_windows + 1)


def train_config(b: BenchConfig) -> TrainConfig:
    return config_from_dict(
        {
            "algorithm": {"name": "ddp"},
            "model": {
                "name": "llama_125m",
                "hidden_size": b.hidden_size,
                "num_layers": b.num_layers,
                "num_heads": b.num_heads,
                "intermediate_size": b.intermediate_size,
                "max_seq_len": b.seq_len,
            },
            "data": {"seq_len": b.seq_len, "max_bytes_per_domain": 400_000, "domains": DOMAINS},
            "train": {
                "steps": b.steps,
                "global_batch_size": b.micro_batch * b.accum,
                "micro_batch_size": b.micro_batch,
                "eval_every": 10**6,
                "checkpoint_every": 10**6,
                "eval_batches": 1,
                "precision": b.precision,
                "compile": b.compile,
                "device": "auto",
            },
            "optim": {"warmup_steps": 1},
            "logger": {
                "console": False,
                "jsonl": True,
                "progress": False,
                "log_every": b.window,
                "peak_flops": b.peak_flops,
            },
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )


# -- the interval and when to stop --------------------------------------------------------
def ratio_interval(pairs: list[tuple[float, float]], level: float = 0.95) -> dict:
    """decentrain / bare over window pairs (decentrain_s, bare_s): the geometric mean ratio and the t interval of
    the mean log ratio, exponentiated; `half_width` is its larger side relative to the centre (exp(h) - 1)."""
    from scipy.stats import t as student

    logs = [math.log(d / b) for d, b in pairs]
    n = len(logs)
    centre = statistics.fmean(logs)
    if n < 2:
        return {"n": n, "ratio": math.exp(centre), "ci95": None, "half_width": math.inf, "level": level}
    h = float(student.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(logs) / math.sqrt(n)
    return {
        "n": n,
        "ratio": math.exp(centre),
        "ci95": [math.exp(centre - h), math.exp(centre + h)],
        "half_width": math.expm1(h),
        "level": level,
    }


def stop_reason(measured: list[tuple[float, float]], b: BenchConfig, elapsed_s: float) -> str | None:
    """Why to stop adding windows now (None: go on): the interval is narrow enough, the windows or the budget
    ran out."""
    if len(measured) >= b.min_windows and ratio_interval(measured)["half_width"] <= b.target:
        return f"decided: 95 % interval within ±{b.target:.0%} after {len(measured)} windows"
    if len(measured) >= b.max_windows:
        return f"max windows ({b.max_windows}) reached"
    if elapsed_s >= b.budget_s:
        return f"budget of {b.budget_s:.0f}s spent after {len(measured)} measured windows"
    return None


# -- the two loops ------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BareLoop:
    """The loop a user writes by hand: compiled model (no KV cache), fused AdamW, autocast, TF32, one host
    read of the loss per window. `window()` runs the next window and returns its seconds per step."""

    def __init__(self, cfg: TrainConfig, b: BenchConfig, blocks: torch.Tensor, device: torch.device, seed: int):
        seed_everything(seed)
        self.b, self.blocks, self.device = b, blocks, device
        self.precision = resolve_precision(b.precision, device)
        set_tf32(device, cfg.train.tf32)  # as the Trainer does (process-wide: the same for both loops)
        self.model = build_model(cfg.model).to(device=device, dtype=weight_dtype(self.precision))
        self.opt, self.sched = build_optimizer(self.model, cfg.optim, cfg.train.steps)
        self.clip = cfg.optim.grad_clip
        apply_compile(self.model, b.compile)
        self.gen = torch.Generator().manual_seed(seed)

    def window(self) -> float:
        b = self.b
        tick = time.perf_counter()
        total = torch.zeros((), device=self.device)
        for _ in range(b.window):
            batch = self.blocks[torch.randint(len(self.blocks), (b.micro_batch * b.accum,), generator=self.gen)]
            for micro in batch.to(self.device, non_blocking=True).split(b.micro_batch):
                with autocast(self.precision, self.device):
                    loss = self.model(input_ids=micro, labels=micro, use_cache=False).loss / b.accum
                loss.backward()
                total += loss.detach()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
        total.item()  # the one host read per window, as decentrain's loop does at its log steps
        return (time.perf_counter() - tick) / b.window


class Interleaved(MetricsLogger):
    """decentrain's metrics logger that, after each of the Trainer's log windows, runs one window of the bare
    loop and keeps the pair; `done` turns true once `stop_reason` says so (the Trainer then stops)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, bare: BareLoop, decide: Callable[[list], str | None]):
        super().__init__(cfg.logger, run_dir, 0)
        self.bare, self.decide = bare, decide
        self.pairs: list[tuple[float, float]] = []
        self.reason: str | None = None

    def log(self, step: int, metrics: dict, console: bool = True) -> None:
        super().log(step, metrics, console)
        if "perf/step_ms" in metrics and self.reason is None:
            self.pairs.append((metrics["perf/step_ms"] / 1e3, self.bare.window()))
            self.reason = self.decide(self.pairs)


def measure_seed(cfg: TrainConfig, b: BenchConfig, world, corpus, run_dir: Path, seed: int, budget_s: float) -> dict:
    """One fresh pair of models, interleaved until the interval decides; the measured window pairs."""
    device = world.device
    t0 = time.perf_counter()
    bare = BareLoop(cfg, b, corpus.train_blocks(), device, seed)
    seed_everything(seed)
    model = build_model(cfg.model)
    per_seed = BenchConfig(**{**asdict(b), "budget_s": budget_s})
    logger = Interleaved(
        cfg, run_dir, bare, lambda pairs: stop_reason(pairs[b.warmup_windows :], per_seed, time.perf_counter() - t0)
    )

    class UntilDecided(ALGORITHMS.get("ddp")):
        def should_stop(self, step: int, total_steps: int) -> bool:
            return logger.reason is not None

    trainer = Trainer(
        cfg.train,
        world,
        UntilDecided(cfg.algorithm, world),
        model,
        corpus,
        run_dir,
        engine=cfg.engine,
        optim=cfg.optim,
        logger=cfg.logger,
    )
    trainer.fit(logger)
    logger.close()
    measured = logger.pairs[b.warmup_windows :]
    return {
        "seed": seed,
        "pairs": measured,
        "reason": logger.reason or "the Trainer reached its step ceiling",
        "seconds": time.perf_counter() - t0,
    }


def summarize(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def measure(b: BenchConfig) -> dict:
    world = init_world(device="auto")
    cfg = train_config(b)
    device = world.device
    corpus = build_corpus(cfg.data, build_tokenizer(cfg.model))
    flops_tok = model_flops_per_token(build_model(cfg.model), b.seq_len)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(name, b.peak_flops)
    tokens = b.micro_batch * b.accum * b.seq_len
    seeds, t0 = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(b.seeds):
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            torch._dynamo.reset()  # each seed compiles its own pair of models
            torch._dynamo.utils.counters.clear()
            budget = (b.budget_s - (time.perf_counter() - t0)) / (b.seeds - seed)
            row = measure_seed(cfg, b, world, corpus, Path(tmp) / f"seed{seed}", seed, budget)
            row["graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])  # both loops' compiled graphs
            row["mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            row["ratio"] = ratio_interval(row["pairs"])["ratio"] if row["pairs"] else None
            seeds.append(row)
            print(
                f"seed {seed}: {len(row['pairs'])} window pairs, ratio {row['ratio'] or math.nan:.3f}; {row['reason']} "
                f"({row['seconds']:.0f}s)",
                flush=True,
            )
    world.shutdown()
    pairs = [p for s in seeds for p in s["pairs"]]
    if not pairs:
        raise RuntimeError(
            f"gpu_step: no window was measured in {b.budget_s:.0f}s (warm-up alone took longer): raise --budget-s"
        )
    out = {
        "gpu": name,
        "peak_flops": peak,
        "flops_per_token": flops_tok,
        "tokens_per_step": tokens,
        "seeds": seeds,
        "ratio": {**summarize([d / bb for d, bb in pairs]), **ratio_interval(pairs), "target": b.target},
    }
    out["ratio"]["mean"] = out["ratio"]["ratio"]  # the headline: the geometric mean of the window ratios
    out["ratio"]["decided"] = out["ratio"]["half_width"] <= b.target and len(pairs) >= b.min_windows
    for i, loop in enumerate(("decentrain", "bare")):
        secs = [p[i] for p in pairs]
        out[f"{loop}_ms"] = summarize([s * 1e3 for s in secs])
        if peak:
            out[f"{loop}_mfu"] = summarize([mfu(tokens / s, flops_tok, peak) for s in secs])
    return out


def text_table(fig: dict) -> str:
    lines = [
        f"gpu_step on {fig['gpu']} (peak {fig['peak_flops'] or float('nan'):.3g} FLOP/s, "
        f"{fig['tokens_per_step']} tokens/step), loops interleaved window by window",
        f"{'loop':>11} | {'ms/step':>15} | {'MFU':>15}",
    ]
    for loop in ("bare", "decentrain"):
        ms, m = fig[f"{loop}_ms"], fig.get(f"{loop}_mfu")
        mfu_txt = f"{m['mean']:.1%} ± {m['std']:.1%}" if m else "n/a"
        lines.append(f"{loop:>11} | {ms['mean']:7.2f} ± {ms['std']:5.2f} | {mfu_txt:>15}")
    r = fig["ratio"]
    ci = f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] (±{r['half_width']:.1%})" if r.get("ci95") else "n/a (one window)"
    lines.append(
        f"decentrain / bare = {r['mean']:.3f}, 95 % interval {ci} over {r['n']} window pairs; "
        f"interval target ±{r['target']:.0%}: {'met' if r['decided'] else 'NOT met'}; ratio target <= 1.05; "
        "MFU target >= 40% (125M, seq 1024, H100/H200)"
    )
    for s in fig["seeds"]:
        lines.append(
            f"seed {s['seed']}: {len(s['pairs'])} pairs, ratio {s['ratio'] or float('nan'):.3f}, {s['reason']}; "
            f"compiled graphs {s.get('graphs')}" + (f", peak {s['mem_gib']:.1f} GiB" if s.get("mem_gib") else "")
        )
    return "\n".join(lines)


def plot(fig: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    pairs = [p for s in fig["seeds"] for p in s["pairs"]]
    ax1.plot([p[0] * 1e3 for p in pairs], label="decentrain Trainer")
    ax1.plot([p[1] * 1e3 for p in pairs], label="bare compiled torch")
    ax1.set_xlabel("measured window (interleaved)")
    ax1.set_ylabel("ms per step")
    ax1.legend()
    ax2.plot([p[0] / p[1] for p in pairs], ".")
    r = fig["ratio"]
    if r.get("ci95"):
        ax2.axhspan(*r["ci95"], alpha=0.3, label="95 % interval")
    ax2.axhline(r["mean"], color="k", lw=1)
    ax2.set_ylabel("decentrain / bare, per window")
    ax2.set_title(f"{fig['gpu']}: ratio {r['mean']:.3f}")
    f.tight_layout()
    save_figure(f, out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, seeds=BenchConfig.seeds)
    for name in ("micro_batch", "accum", "seq_len", "window", "warmup_windows", "min_windows", "max_windows"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(BenchConfig, name))
    p.add_argument("--target", type=float, default=BenchConfig.target, help="stop at a 95 %% interval within ±target")
    p.add_argument("--budget-s", type=float, default=BenchConfig.budget_s)
    p.add_argument("--precision", default=BenchConfig.precision, choices=["fp32", "bf16_autocast", "bf16"])
    p.add_argument("--compile", default=BenchConfig.compile, choices=["none", "model", "blocks"])
    p.add_argument("--peak-flops", type=float, default=None, help="FLOP/s of the GPU (default: looked up by name)")
    args = parse(p, argv)  # --smoke: tiny model, a few short windows, any device; writes no results
    b = BenchConfig(**own_flags(args), smoke=args.smoke)
    if b.smoke:
        b.hidden_size, b.num_layers, b.num_heads, b.intermediate_size = 32, 2, 2, 64
        b.seq_len, b.micro_batch, b.window, b.compile = min(b.seq_len, 64), 2, 2, "none"
        b.warmup_windows, b.min_windows, b.max_windows, b.seeds = 1, 3, 4, 1
    elif not torch.cuda.is_available():
        print(
            "gpu_step: no CUDA device here; nothing measured (run it on a GPU machine, "
            "or --smoke to check the code path)"
        )
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
