"""The typed configuration of an HDEE run (train and evaluate) and its one-time conversion from Hydra.

`HdeeConfig` holds the plan plus the shared model/data/optimizer/loop settings that
every seed and expert job uses. Recipes call `register_configs("hdee")` (in
decentrain/config.py, the composition root) once, compose `conf/hdee.yaml`, and convert
the resolved dict with `hdee_config_from_dict`; library code below only ever sees these
dataclasses. `job.algorithm` is typed by the algorithm registry from its `name` (the
composition root registers the loop algorithms), never imported from its family.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

from omegaconf import OmegaConf

from decentrain.algorithms.base import ALGORITHMS, AlgorithmConfig
from decentrain.algorithms.hdee.compute_budget import check_budget, homogeneous_baseline
from decentrain.algorithms.hdee.mixing import WEIGHTINGS
from decentrain.algorithms.hdee.plan import EnsemblePlan, SeedConfig, validate
from decentrain.algorithms.pretraining.config import LoopConfig
from decentrain.algorithms.pretraining.engines import ENGINES, EngineConfig, OptimConfig
from decentrain.core.config_checks import check_range
from decentrain.core.launch.config import LauncherConfig
from decentrain.core.metrics import LoggerConfig
from decentrain.core.typed import typed
from decentrain.data.blocks import SPLITS, DataConfig
from decentrain.data.corpus import DOMAINS
from decentrain.models.factory import ModelConfig, build_tokenizer, hf_config

CONFIG_FILE = "hdee.yaml"
STAGES = ("all", "seeds", "seed", "lane", "lanes")


@dataclass
class BudgetConfig:
    """The homogeneous baseline a plan must match: every lane at one width and equal steps."""

    baseline_intermediate_size: int = 352
    baseline_steps_per_domain: int = 40
    tolerance: float = 0.05
    # Seeds are shared starting points, trained once; by default only the experts' compute
    # is matched (a heterogeneous-size plan needs one seed per width).
    include_seeds: bool = False

    def __post_init__(self) -> None:
        if self.baseline_intermediate_size < 1:
            raise ValueError(f"budget.baseline_intermediate_size={self.baseline_intermediate_size} must be >= 1")
        if self.baseline_steps_per_domain < 1:
            raise ValueError(f"budget.baseline_steps_per_domain={self.baseline_steps_per_domain} must be >= 1")
        check_range("budget.tolerance", self.tolerance, 0, None)  # NaN compares false: any plan would pass


@dataclass
class EvalConfig:
    domains: list[str] = field(default_factory=list)  # empty: every domain of data.domains
    split: str = "test"
    weightings: list[str] = field(default_factory=lambda: ["uniform", "cached", "topk", "average"])
    top_k: int = 1
    prior_alpha: float = 0.3  # EMA rate of the cached prior
    prior_sequences: int = 100  # validation sequences the cached prior sees
    batch_size: int = 16
    max_blocks: int | None = None  # cap on evaluated blocks per domain; None: the whole split
    out: str | None = None  # JSON results path; None: <ensemble_dir>/eval_<split>.json

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"eval.split={self.split!r} is unknown; allowed: {list(SPLITS)}")
        if not self.weightings:
            raise ValueError(f"eval.weightings is empty; allowed: {WEIGHTINGS.names()}")
        for w in self.weightings:
            WEIGHTINGS.get(w, field="eval.weightings")
        for f in ("top_k", "prior_sequences", "batch_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"eval.{f}={getattr(self, f)} must be >= 1")
        if not 0 < self.prior_alpha <= 1:
            raise ValueError(f"eval.prior_alpha={self.prior_alpha} must be in (0, 1]")
        if self.max_blocks is not None and self.max_blocks < 1:
            raise ValueError(f"eval.max_blocks={self.max_blocks} must be >= 1")


@dataclass
class JobConfig:
    """Which part of the plan this process runs, and how each seed or expert run trains.

    `all` trains seeds, then every lane as its own job. Each run is one pre-training job
    (pretraining/run.py) of the `algorithm` and `engine` sections: `algorithm@job.algorithm=noloco`
    trains a lane with a NoLoCo group of `launcher.nproc_per_node` replicas.
    """

    stage: str = "all"
    index: int | None = None  # the seed (stage=seed) or lane (stage=lane) to run
    max_parallel: int = 3  # lane jobs running at once under stage=all
    # as a run's `algorithm` section (conf/algorithm/): the base class here, so that Hydra can extend it
    # with any algorithm's schema; typed by its name in HdeeConfig
    algorithm: Any = field(default_factory=AlgorithmConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)  # as a run's `engine` section (conf/engine/)
    RENAMED: ClassVar[dict[str, str]] = {"expert_algorithm": "algorithm.name"}  # the older key

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"job.stage={self.stage!r} is unknown; allowed: {list(STAGES)}")
        if self.stage in ("seed", "lane") and (self.index is None or self.index < 0):
            raise ValueError(f"job.index={self.index} must name a {self.stage} (>= 0) when job.stage={self.stage}")
        if self.max_parallel < 1:
            raise ValueError(f"job.max_parallel={self.max_parallel} must be >= 1")
        name = getattr(self.algorithm, "name", None) or dict(self.algorithm).get("name", "ddp")
        ALGORITHMS.get(name, field="job.algorithm.name")
        # typed in HdeeConfig (typing it here would fix the schema's node to DDPConfig for Hydra)

    def typed(self) -> None:
        """Type `algorithm` and `engine` by their names (each entry's own config class)."""
        self.engine = ENGINES.config(self.engine, where="job.engine")
        self.algorithm = ALGORITHMS.config(self.algorithm, where="job.algorithm")


@dataclass
class HdeeConfig:
    plan: Optional[EnsemblePlan] = None  # from conf/hdee_plan/
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # The domain phase's optimizer and schedule (paper: continued pre-training at a 10x lower lr,
    # 6e-5 -> 3e-5 with 50 warm-up steps); None: the seeds' `optim`.
    expert_optim: Optional[OptimConfig] = None
    train: LoopConfig = field(default_factory=LoopConfig)  # train.steps is set per seed / expert run
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=lambda: LauncherConfig(nproc_per_node=1))
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    job: JobConfig = field(default_factory=JobConfig)
    ensemble_dir: str = "runs/hdee"  # seeds and experts live in <ensemble_dir>/<run name>/model
    resume: bool = True
    experiment: str | None = None

    def __post_init__(self) -> None:
        if self.plan is None:
            raise ValueError("plan is missing; pick one with hdee_plan=<homogeneous|het_steps|het_sizes|...>")
        self.job.typed()
        tokens = self.train.global_batch_size * self.data.seq_len
        if self.plan.tokens_per_step != tokens:
            raise ValueError(
                f"plan.tokens_per_step={self.plan.tokens_per_step} must equal train.global_batch_size x data.seq_len "
                f"= {self.train.global_batch_size} x {self.data.seq_len} = {tokens}; the budget counts these tokens"
            )
        if self.job.stage == "seed" and self.job.index >= len(self.plan.seeds):
            raise ValueError(f"job.index={self.job.index} names no seed; the plan has {len(self.plan.seeds)}")
        if self.job.stage == "lane" and self.job.index >= self.plan.num_experts:
            raise ValueError(f"job.index={self.job.index} names no lane; the plan has {self.plan.num_experts}")
        for d in self.eval.domains:
            if self.data.source == "offline":
                DOMAINS.get(d, field="eval.domains")


def expert_config(cfg: HdeeConfig) -> HdeeConfig:
    """The config an expert (domain-phase) run trains with: `expert_optim` in place of `optim`."""
    return cfg if cfg.expert_optim is None else dataclasses.replace(cfg, optim=cfg.expert_optim)


def plan_domains(cfg: HdeeConfig) -> list[str]:
    """Every domain the plan trains on, seeds first, in first-seen order."""
    seen: dict[str, None] = {}
    for seed in cfg.plan.seeds:
        seen.update(dict.fromkeys(seed.domains))
    for lane in cfg.plan.lanes:
        seen.update(dict.fromkeys(lane.domains))
    return list(seen)


def eval_domains(cfg: HdeeConfig) -> list[str]:
    return list(cfg.eval.domains) or list(cfg.data.domains)


def baseline_plan(cfg: HdeeConfig) -> EnsemblePlan:
    b = cfg.budget
    ref = cfg.plan.seeds[0]
    seed = SeedConfig(
        name="baseline",
        size="M",
        intermediate_size=b.baseline_intermediate_size,
        steps=ref.steps,
        domains=list(ref.domains),
        tokenizer=cfg.plan.lanes[0].tokenizer,
    )
    return homogeneous_baseline(cfg.plan, seed, b.baseline_steps_per_domain)


def check_plan(cfg: HdeeConfig) -> float:
    """Everything that must hold before any training: known domains, fields, and the budget.

    Returns the plan's relative compute difference to its homogeneous baseline.
    """
    known = DOMAINS.names() if cfg.data.source == "offline" else list(cfg.data.domains)
    validate(cfg.plan, known)
    world, shards = cfg.launcher.world_size or 1, cfg.job.engine.shards_per_replica
    if world % shards:
        raise ValueError(f"job.engine.shards_per_replica={shards} does not divide world size {world} into replicas")
    ALGORITHMS.get(cfg.job.algorithm.name).check_world(cfg.job.algorithm, world // shards)  # e.g. NoLoCo's odd world
    vocab = len(build_tokenizer(dataclasses.replace(cfg.model, tokenizer=cfg.plan.lanes[0].tokenizer)))
    config = hf_config(cfg.model, vocab)
    return check_budget(cfg.plan, baseline_plan(cfg), config, cfg.budget.tolerance, cfg.budget.include_seeds)


def hdee_config_from_dict(raw: dict[str, Any]) -> HdeeConfig:
    """The recipe's one conversion: a resolved plain dict (from Hydra) to typed dataclasses.

    Unknown keys fail naming the field; each dataclass validates itself on construction.
    """
    return typed(HdeeConfig, raw)


def save_config(ensemble_dir: str | Path, raw: dict[str, Any]) -> Path:
    """Write the resolved config as `<ensemble_dir>/hdee.yaml` (atomic: parallel jobs may race)."""
    out = Path(ensemble_dir) / CONFIG_FILE
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(OmegaConf.to_yaml(raw))
    os.replace(tmp, out)
    return out


def load_saved_config(ensemble_dir: str | Path, overrides: list[str] = ()) -> HdeeConfig | None:
    """The config an ensemble was trained with, with `key=value` overrides; None if there is none."""
    path = Path(ensemble_dir) / CONFIG_FILE
    if not path.exists():
        return None
    raw = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(list(overrides)))
    return hdee_config_from_dict(OmegaConf.to_container(raw, resolve=True))
