"""HDEE training: seeds on general text, then each lane's experts branched from them.

Every seed and every expert iteration is one ordinary pre-training job (pretraining/run.py,
the path recipes/train.py runs too) of `job.algorithm` and `job.engine`: one process, or a
group of replicas (DDP, DiLoCo, a NoLoCo gossip group). Runs are saved with `save_pretrained` to
`<ensemble_dir>/<run name>/model`, where the run name is unique per (lane, iteration,
size), so no job ever overwrites another's weights. A lane's iteration k starts from
iteration k-1's saved model, the first from its seed's. Lanes never communicate: each
one is its own job (a process here, a Hydra multirun job or a Slurm task elsewhere).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from omegaconf import OmegaConf

from decentrain.algorithms.hdee.config import HdeeConfig, expert_config
from decentrain.algorithms.hdee.plan import ExpertRun, SeedConfig
from decentrain.algorithms.pretraining.config import TrainConfig, validate
from decentrain.algorithms.pretraining.run import MODEL_SUBDIR, run_pretraining
from decentrain.core.world import World
from decentrain.models.factory import ModelConfig

log = logging.getLogger(__name__)


def model_dir(ensemble_dir: str | Path, run: str) -> Path:
    """Where run `run` (a seed name or an expert's run name) keeps its save_pretrained weights."""
    return Path(ensemble_dir) / run / MODEL_SUBDIR


def run_config(
    cfg: HdeeConfig,
    name: str,
    model: ModelConfig,
    domains: list[str],
    steps: int,
    seed: int,
    schedule_steps: int | None = None,
) -> TrainConfig:
    """One seed or expert run as an ordinary pre-training job: the HDEE config's shared sections,
    `job.algorithm` and `job.engine`, this run's model, domains, steps (of `schedule_steps`) and seed."""
    return TrainConfig(
        algorithm=cfg.job.algorithm,
        model=model,
        data=dataclasses.replace(cfg.data, domains=list(domains)),
        logger=cfg.logger,
        launcher=cfg.launcher,
        optim=cfg.optim,
        train=dataclasses.replace(
            cfg.train, steps=schedule_steps or steps, stop_at=steps if schedule_steps else None, seed=seed
        ),
        engine=cfg.job.engine,
        run_dir=str(Path(cfg.ensemble_dir) / name),
        resume=cfg.resume,
    )


def _train_run(
    cfg: HdeeConfig,
    world: World,
    name: str,
    model: ModelConfig,
    domains: list[str],
    steps: int,
    seed: int,
    schedule_steps: int | None = None,
    poll_s: float = 0.2,
) -> Path:
    """One run of the shared job path (pretraining/run.py): `steps` steps of a `schedule_steps`-step LR
    schedule (an expert stops inside one shared cosine); resumes from its own checkpoints. Gossip keys of
    consecutive runs in one process group are apart by construction (`core/comm/membership.job_prefix`)."""
    tcfg = run_config(cfg, name, model, domains, steps, seed, schedule_steps)
    validate(tcfg, world.world_size)  # e.g. a batch that does not divide over this job's ranks
    run_dir = Path(tcfg.run_dir)
    if world.is_main:
        log.info(f"[hdee] {name}: {steps} steps on {list(domains)}, {tcfg.algorithm.name} on world {world.world_size}")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(tcfg)))
    run_pretraining(tcfg, world, run_dir)
    out = run_dir / MODEL_SUBDIR
    # The next run branches from `out` on every rank. Wait for the main rank's (atomic) save on the
    # file system, not in a barrier: a gossip group may have lost a worker, and a replacement is in
    # no world-wide group.
    while not out.exists():
        time.sleep(poll_s)
    return out


def train_seed(cfg: HdeeConfig, world: World, seed: SeedConfig) -> Path:
    """Train one seed from scratch (or from `model.pretrained`) at its own FFN width."""
    out = model_dir(cfg.ensemble_dir, seed.name)
    if out.exists():
        if world.is_main:
            log.info(f"[hdee] seed {seed.name}: {out} exists, skipping")
        return out
    model = dataclasses.replace(cfg.model, tokenizer=seed.tokenizer, intermediate_size=seed.intermediate_size)
    if cfg.model.pretrained:
        from transformers import AutoConfig

        width = AutoConfig.from_pretrained(cfg.model.pretrained).intermediate_size
        if width != seed.intermediate_size:
            raise ValueError(
                f"seed {seed.name!r}: model.pretrained={cfg.model.pretrained!r} has intermediate_size="
                f"{width}, the plan asks for seeds[].intermediate_size={seed.intermediate_size}"
            )
    return _train_run(cfg, world, seed.name, model, seed.domains, seed.steps, cfg.train.seed)


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
    model = dataclasses.replace(cfg.model, pretrained=str(init), tokenizer=str(init))
    # Lanes draw different data orders even on a shared domain.
    seed = cfg.train.seed + 1000 * (run.lane + 1) + run.iteration
    return _train_run(
        expert_config(cfg),
        world,
        run.name,
        model,
        [run.domain],
        run.steps,
        seed,
        schedule_steps=cfg.plan.domain_schedule_steps,
    )


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
