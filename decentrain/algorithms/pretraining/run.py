"""Build and run one pre-training job (any registered loop algorithm) from a TrainConfig.

The one job path: `recipes/train.py` runs it once, HDEE (algorithms/hdee/train.py) once per
seed and expert run, each with its own `algorithm`, `engine`, model and data sections.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from decentrain.algorithms.pretraining.config import TrainConfig
from decentrain.algorithms.pretraining.trainer import Trainer, TrainResult, seed_everything
from decentrain.algorithms.pretraining.transports import transport_spec
from decentrain.core.mesh import replica_layout
from decentrain.core.metrics import MetricsLogger, drop_rows_after, format_bytes, metrics_file, plot_curves, read_jsonl
from decentrain.core.world import World
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import build_model, build_tokenizer, num_params, save_model

log = logging.getLogger(__name__)

MODEL_SUBDIR = "model"  # <run_dir>/model: the run's save_pretrained weights
# <run_dir>/result.json, rank 0's at the end: the TrainResult, the corpus and the run's last line, for
# whoever started the run (decentrain compare reads it; nobody parses the console)
RESULT_FILE = "result.json"


def save_atomic(model, tokenizer, out: Path) -> None:
    """save_pretrained into a temporary dir, then rename: a model dir that exists is complete
    (HDEE branches later runs from it and skips runs whose model exists)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp)
    shutil.rmtree(out, ignore_errors=True)  # a rerun in the same run_dir replaces the old weights
    os.replace(tmp, out)


def run_pretraining(cfg: TrainConfig, world: World, run_dir: Path, config_dict: dict | None = None) -> TrainResult:
    seed_everything(cfg.train.seed)  # same seed on every rank: replicas start identical
    tokenizer = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tokenizer)
    corpus = build_corpus(cfg.data, tokenizer)
    # ranks draw different randomness after the shared init (dropout); resume restores it
    torch.manual_seed(cfg.train.seed + 1 + world.rank)
    # replicas × shards: the outer algorithm sees one rank per replica (the whole world when 1 shard)
    layout = replica_layout(world, cfg.engine.shards_per_replica)
    spec = transport_spec(cfg)  # transport.name: how this replica reaches the others
    algorithm = spec.algorithm(cfg, layout.outer)
    trainer = Trainer(
        cfg.train,
        world,
        algorithm,
        model,
        corpus,
        run_dir,
        layout,
        engine=cfg.engine,
        optim=cfg.optim,
        logger=cfg.logger,
        resume=cfg.resume,
        sampler=spec.sampler(cfg, world),
    )
    resumed = trainer.maybe_resume()
    if resumed is not None:  # the steps after the checkpoint will be logged again: drop their old rows
        drop_rows_after(run_dir / metrics_file(world.rank), resumed)
    logger = MetricsLogger(cfg.logger, run_dir, world.rank, config_dict, total_steps=cfg.train.steps)
    # every metrics file names the text it trained on; at step 0, so that no reader takes it for progress
    logger.log(0, {"corpus": corpus.identity}, console=False)
    if world.is_main:
        shards = (
            f" ({layout.replicas} replicas x {layout.shards} shards, {cfg.engine.name})" if layout.shards > 1 else ""
        )
        where = f"resumed from step {resumed}" if resumed is not None else "from scratch"
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        if restarts and spec.heals_on_restart(cfg):  # torchrun restarted this group alone: it heals from a live one
            where = f"restarted (restart {restarts}), healing from a live group at its first quorum"
        log.info(
            f"[decentrain] {cfg.algorithm.name}: {num_params(model) / 1e6:.2f}M params, "
            f"world {world.world_size}{shards}, {len(trainer.train_blocks)} train blocks of {cfg.data.seq_len} tokens "
            f"({corpus.label}), {where}; run dir {run_dir}"
        )
    try:
        result = trainer.fit(logger)
    finally:
        logger.close()
    whole = trainer.engine.full_state_dict()  # collective for sharded engines: every rank calls it
    if world.is_main:
        if whole is None:
            save_atomic(trainer.model, tokenizer, run_dir / MODEL_SUBDIR)
        else:  # a sharded replica: its gathered weights, in a plain copy of the model
            plain = build_model(cfg.model, tokenizer)
            plain.load_state_dict(whole)
            save_atomic(plain, tokenizer, run_dir / MODEL_SUBDIR)
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists():
            plot_curves(
                read_jsonl(metrics),
                ["train/loss", "eval/loss"],
                run_dir / "loss.png",
                title=f"{cfg.algorithm.name} on {world.world_size} ranks",
            )
        sent = "" if result.bytes_sent is None else f", sent {format_bytes(result.bytes_sent)} per worker"
        bpb = f", {sum(result.eval_bpb.values()) / len(result.eval_bpb):.4f} bits per byte" if result.eval_bpb else ""
        line = (
            f"done: step {result.final_step}, train loss {result.train_loss:.4f}, "
            f"eval loss {sum(result.eval_loss.values()) / max(1, len(result.eval_loss)):.4f}{bpb}, "
            f"{result.seconds:.1f}s{sent}; corpus {corpus.label}"
        )
        log.info(f"[decentrain] {line}")
        (run_dir / RESULT_FILE).write_text(json.dumps({**asdict(result), "corpus": corpus.identity, "line": line}))
    return result
