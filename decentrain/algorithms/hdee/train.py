"""HDEE training: seeds on general text, then each lane's experts branched from them.

Every seed and every expert iteration is one ordinary run of the shared `Trainer`
(optionally data parallel inside the run). Runs are saved with `save_pretrained` to
`<ensemble_dir>/<run name>/model`, where the run name is unique per (lane, iteration,
size), so no job ever overwrites another's weights. A lane's iteration k starts from
iteration k-1's saved model, the first from its seed's. Lanes never communicate: each
one is its own job (a process here, a Hydra multirun job or a Slurm task elsewhere).
"""

from __future__ import annotations

import logging
import dataclasses
import os
import shutil
from pathlib import Path

import torch

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.common.config import TrainConfig, validate
from decentrain.algorithms.common.trainer import Trainer, seed_everything
from decentrain.algorithms.hdee.config import HdeeConfig, expert_config
from decentrain.algorithms.hdee.plan import ExpertRun, SeedConfig
from decentrain.core.metrics import MetricsLogger
from decentrain.core.world import World
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import build_model, build_tokenizer, num_params, save_model

MODEL_SUBDIR = "model"

log = logging.getLogger(__name__)


def model_dir(ensemble_dir: str | Path, run: str) -> Path:
    """Where run `run` (a seed name or an expert's run name) keeps its save_pretrained weights."""
    return Path(ensemble_dir) / run / MODEL_SUBDIR


def _save_atomic(model, tokenizer, out: Path) -> None:
    # A model dir that exists is complete: later jobs branch from it and skip re-training it.
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp)
    os.replace(tmp, out)


def _train_run(cfg: HdeeConfig, world: World, name: str, model, tokenizer, domains: list[str], steps: int, seed: int,
               schedule_steps: int | None = None) -> Path:
    """One Trainer run on `domains` for `steps` steps (of a `schedule_steps` LR schedule); resumes from its own checkpoints."""
    run_dir = Path(cfg.ensemble_dir) / name
    out = run_dir / MODEL_SUBDIR
    data = dataclasses.replace(cfg.data, domains=list(domains))
    loop = dataclasses.replace(cfg.train, steps=schedule_steps or steps, stop_at=steps if schedule_steps else None, seed=seed)
    algo_cls = ALGORITHMS.get(cfg.job.expert_algorithm, field="job.expert_algorithm")
    tcfg = TrainConfig(algorithm=algo_cls.config_cls(), model=cfg.model, data=data, logger=cfg.logger,
                       launcher=cfg.launcher, optim=cfg.optim, train=loop, run_dir=str(run_dir), resume=cfg.resume)
    validate(tcfg, world.world_size)  # e.g. a batch that does not divide over this job's ranks
    corpus = build_corpus(data, tokenizer)
    torch.manual_seed(seed + 1 + world.rank)  # per-rank randomness after the shared init
    trainer = Trainer(tcfg, world, algo_cls(tcfg.algorithm, world), model, corpus, run_dir)
    resumed = trainer.maybe_resume()
    if world.is_main:
        where = f"resumed at step {resumed}" if resumed is not None else "from its init"
        log.info(f"[hdee] {name}: {num_params(model) / 1e6:.2f}M params, {steps} steps on {domains}, "
                 f"world {world.world_size}, {where}")
    logger = MetricsLogger(cfg.logger, run_dir, world.rank, total_steps=steps)
    try:
        result = trainer.fit(logger)
    finally:
        logger.close()
    if world.is_main:
        _save_atomic(trainer.model, tokenizer, out)
        log.info(f"[hdee] {name}: done, eval loss {result.eval_loss} in {result.seconds:.1f}s -> {out}")
    world.barrier()
    return out


def train_seed(cfg: HdeeConfig, world: World, seed: SeedConfig) -> Path:
    """Train one seed from scratch (or from `model.pretrained`) at its own FFN width."""
    out = model_dir(cfg.ensemble_dir, seed.name)
    if out.exists():
        if world.is_main:
            log.info(f"[hdee] seed {seed.name}: {out} exists, skipping")
        return out
    model_cfg = dataclasses.replace(cfg.model, tokenizer=seed.tokenizer)
    tokenizer = build_tokenizer(model_cfg)
    seed_everything(cfg.train.seed)  # identical init on every rank of this job
    model = build_model(model_cfg, tokenizer, intermediate_size=seed.intermediate_size)
    if model.config.intermediate_size != seed.intermediate_size:
        raise ValueError(
            f"seed {seed.name!r}: model.pretrained={cfg.model.pretrained!r} has intermediate_size="
            f"{model.config.intermediate_size}, the plan asks for seeds[].intermediate_size={seed.intermediate_size}"
        )
    return _train_run(cfg, world, seed.name, model, tokenizer, seed.domains, seed.steps, cfg.train.seed)


def train_expert(cfg: HdeeConfig, world: World, run: ExpertRun) -> Path:
    """Branch: continue `run.init_from`'s saved model on `run.domain`."""
    out = model_dir(cfg.ensemble_dir, run.name)
    if out.exists():
        if world.is_main:
            log.info(f"[hdee] {run.name}: {out} exists, skipping")
        return out
    init = model_dir(cfg.ensemble_dir, run.init_from)
    if not init.exists():
        raise FileNotFoundError(
            f"expert {run.name} (lanes[{run.lane}] iteration {run.iteration}) starts from {run.init_from!r}, "
            f"but {init} does not exist; train it first (job.stage=seeds, or the lane's earlier iterations)"
        )
    model_cfg = dataclasses.replace(cfg.model, pretrained=str(init), tokenizer=str(init))
    tokenizer = build_tokenizer(model_cfg)
    model = build_model(model_cfg, tokenizer)
    # Lanes draw different data orders even on a shared domain.
    seed = cfg.train.seed + 1000 * (run.lane + 1) + run.iteration
    return _train_run(expert_config(cfg), world, run.name, model, tokenizer, [run.domain], run.steps, seed,
                      cfg.plan.domain_schedule_steps)


def train_lane(cfg: HdeeConfig, world: World, lane: int) -> Path:
    """Every iteration of one lane, in order; returns the final expert's model dir."""
    runs = [r for r in cfg.plan.expert_runs() if r.lane == lane]
    if not runs:
        raise ValueError(f"job.index={lane} names no lane; the plan has {cfg.plan.num_experts}")
    return [train_expert(cfg, world, r) for r in runs][-1]


def run_stage(cfg: HdeeConfig, world: World) -> list[Path]:
    """Run `cfg.job.stage` in this process (group): one seed or lane, all seeds, all lanes, or everything."""
    job = cfg.job
    if job.stage == "seed":
        return [train_seed(cfg, world, cfg.plan.seeds[job.index])]
    if job.stage == "lane":
        return [train_lane(cfg, world, job.index)]
    seeds = [train_seed(cfg, world, s) for s in cfg.plan.seeds] if job.stage in ("seeds", "all") else []
    lanes = [train_lane(cfg, world, i) for i in range(cfg.plan.num_experts)] if job.stage in ("lanes", "all") else []
    return seeds + lanes
