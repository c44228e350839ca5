"""Step time of decentrain's DDP loop against a bare PyTorch loop, 1 and 2 ranks.

Same model, batch, optimizer, schedule and thread count. Rounds alternate bare /
decentrain so that machine noise hits both; the figure is the median of per-round
ratios of median step times (target <= 1.05).

    python -m benchmarks.step_overhead            # writes results/step_overhead.{json,png}
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from benchmarks.harness import Harness, bench_parser, parse, save_figure
from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.trainer import Trainer, build_optimizer, seed_everything
from decentrain.config import TrainConfig, config_from_dict
from decentrain.core.launch.launcher import run_on_ranks
from decentrain.core.metrics import MetricsLogger
from decentrain.core.world import init_world
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import build_model, build_tokenizer


@dataclass
class BenchConfig:
    ranks: list[int] = field(default_factory=lambda: [1, 2])
    rounds: int = 5
    steps: int = 25  # per round and variant
    warmup: int = 3  # first steps of each round not counted
    threads: int = 1
    hidden_size: int = 128
    num_layers: int = 4
    seq_len: int = 128
    micro_batch_size: int = 8


def train_config(b: BenchConfig, world_size: int) -> TrainConfig:
    return config_from_dict(
        {
            "algorithm": {"name": "ddp"},
            "model": {"hidden_size": b.hidden_size, "num_layers": b.num_layers},
            "data": {"seq_len": b.seq_len, "max_bytes_per_domain": 100_000},
            "train": {
                "steps": b.steps,
                "global_batch_size": b.micro_batch_size * world_size,
                "micro_batch_size": b.micro_batch_size,
                "eval_every": 10**6,
                "checkpoint_every": 10**6,
                "eval_batches": 1,
                "threads": b.threads,
            },
            "logger": {"console": False, "jsonl": False, "progress": False},
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )


def bare_steps(cfg: TrainConfig, world, blocks: torch.Tensor) -> list[float]:
    """The loop a user would write by hand: no hooks, no sampler, no logging."""
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model)
    # the same DDP settings as decentrain's, so the ratio is the loop's overhead alone
    ddp = cfg.algorithm
    wrapped = (
        DistributedDataParallel(
            model, bucket_cap_mb=ddp.bucket_cap_mb, gradient_as_bucket_view=ddp.gradient_as_bucket_view
        )
        if world.is_distributed
        else model
    )
    opt, sched = build_optimizer(model, cfg.optim, cfg.train.steps)
    gen = torch.Generator().manual_seed(world.rank)
    times = []
    for _ in range(cfg.train.steps):
        tick = time.perf_counter()
        batch = blocks[torch.randint(len(blocks), (cfg.train.micro_batch_size,), generator=gen)]
        loss = wrapped(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - tick)
    return times


def decentrain_steps(cfg: TrainConfig, world, corpus, run_dir: Path) -> list[float]:
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model)
    trainer = Trainer(
        cfg.train,
        world,
        ALGORITHMS.get("ddp")(cfg.algorithm, world),
        model,
        corpus,
        run_dir,
        engine=cfg.engine,
        optim=cfg.optim,
        logger=cfg.logger,
    )
    logger = MetricsLogger(cfg.logger, run_dir, world.rank)
    trainer.fit(logger)
    logger.close()
    return trainer.step_times


def measure(b: BenchConfig, world_size: int) -> dict:
    world = init_world(threads=b.threads)
    cfg = train_config(b, world_size)
    corpus = build_corpus(cfg.data, build_tokenizer(cfg.model))
    blocks = corpus.train_blocks()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(b.rounds):
            bare = statistics.median(bare_steps(cfg, world, blocks)[b.warmup :])
            ours = statistics.median(decentrain_steps(cfg, world, corpus, Path(tmp) / f"r{r}")[b.warmup :])
            rounds.append({"bare_s": bare, "decentrain_s": ours, "ratio": ours / bare})
    world.shutdown()
    return {
        "world_size": world_size,
        "rounds": rounds,
        "ratio": statistics.median(x["ratio"] for x in rounds),
        "bare_step_s": statistics.median(x["bare_s"] for x in rounds),
        "decentrain_step_s": statistics.median(x["decentrain_s"] for x in rounds),
    }


def plot(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(results))
    ax.bar([x - 0.2 for x in xs], [r["bare_step_s"] * 1e3 for r in results], 0.4, label="bare PyTorch")
    ax.bar([x + 0.2 for x in xs], [r["decentrain_step_s"] * 1e3 for r in results], 0.4, label="decentrain DDP loop")
    ax.set_xticks(list(xs), [f"{r['world_size']} rank(s)\nratio {r['ratio']:.3f}" for r in results])
    ax.set_ylabel("median step time (ms)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=120)


def main() -> None:
    p = bench_parser(__doc__, seeds=None)
    p.add_argument("--rounds", type=int, default=BenchConfig.rounds)
    p.add_argument("--steps", type=int, default=BenchConfig.steps)
    args = parse(p)
    b = BenchConfig(rounds=args.rounds, steps=args.steps)
    hz = Harness("step_overhead", __file__, asdict(b), allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    results = []
    for n in b.ranks:
        results.append(measure(b, 1) if n == 1 else run_on_ranks(measure, n, b, n)[0])
    print(
        hz.write({"results": results}, text, lambda rec, png: plot(rec["figures"]["results"], png))["txt"].read_text()
    )


def text(record: dict) -> str:
    lines = [f"{'ranks':>5} | {'bare ms':>8} | {'decentrain ms':>13} | ratio (target <= 1.05)"]
    for r in record["figures"]["results"]:
        lines.append(
            f"{r['world_size']:>5} | {r['bare_step_s'] * 1e3:8.2f} | {r['decentrain_step_s'] * 1e3:13.2f} | "
            f"{r['ratio']:.3f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
