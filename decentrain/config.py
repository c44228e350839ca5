"""The typed configuration of a training run and its one-time conversion from Hydra.

Schemas live next to what they build (ModelConfig in models/, DataConfig in data/,
each algorithm's config in its package); this module assembles them, registers them
with Hydra's ConfigStore, and checks a config against a world size before any
process group exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from pathlib import Path

from omegaconf import OmegaConf

from decentrain.algorithms import ALGORITHMS, AlgorithmConfig
from decentrain.algorithms.common.engine import EngineConfig
from decentrain.algorithms.common.speed import COMPILE_SCOPES, PRECISIONS
from decentrain.core.checks import check_range
from decentrain.core.metrics import LoggerConfig
from decentrain.core.world import DEVICES
from decentrain.data.blocks import DataConfig
from decentrain.models.factory import ModelConfig

SCHEDULES = ("cosine", "constant")
LAUNCHERS = ("local", "torchrun")


@dataclass
class OptimConfig:
    lr: float = 2e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_steps: int = 10
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping

    def __post_init__(self) -> None:
        check_range("optim.lr", self.lr, 0, 1, low_open=True)  # AdamW above 1 only diverges
        check_range("optim.weight_decay", self.weight_decay, 0, 1)
        if len(self.betas) != 2:
            raise ValueError(f"optim.betas={list(self.betas)} must be two numbers, each in [0, 1)")
        for i, b in enumerate(self.betas):
            check_range(f"optim.betas[{i}]", b, 0, 1, high_open=True)
        check_range("optim.min_lr_ratio", self.min_lr_ratio, 0, 1)
        check_range("optim.grad_clip", self.grad_clip, 0)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r} is unknown; allowed: {list(SCHEDULES)}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={self.warmup_steps} must be >= 0")


@dataclass
class LoopConfig:
    steps: int = 200
    global_batch_size: int = 16
    micro_batch_size: int = 8
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    seed: int = 0
    threads: int | None = None  # torch threads per rank; None leaves torch's default
    stop_at: int | None = None  # leave early at this step, as a preempted job would (resume continues)
    device: str = "auto"  # auto | cpu | cuda; more local ranks than GPUs share them round-robin over gloo
    precision: str = "auto"  # auto (bf16_autocast on CUDA, fp32 on CPU) | fp32 | bf16_autocast | bf16 (pure)
    compile: str = "none"  # none | model | blocks: torch.compile of the whole model or of each layer

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"train.device={self.device!r} is unknown; allowed: {list(DEVICES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision={self.precision!r} is unknown; allowed: {list(PRECISIONS)}")
        if self.compile not in COMPILE_SCOPES:
            raise ValueError(f"train.compile={self.compile!r} is unknown; allowed: {list(COMPILE_SCOPES)}")
        if self.stop_at is not None and not 1 <= self.stop_at <= self.steps:
            raise ValueError(f"train.stop_at={self.stop_at} must be in [1, train.steps={self.steps}]")
        for f in ("steps", "global_batch_size", "micro_batch_size", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, f) < 1:
                raise ValueError(f"train.{f}={getattr(self, f)} must be >= 1")
        check_range("train.seed", self.seed, 0, 2**32 - 1)  # numpy's seed range
        check_range("train.threads", self.threads, 1, 1024, none_ok=True)


@dataclass
class LauncherConfig:
    name: str = "local"
    nproc_per_node: int | None = 2  # None: whatever torchrun started
    nnodes: int = 1
    rdzv_endpoint: str = "localhost:0"
    max_restarts: int = 0

    def __post_init__(self) -> None:
        if self.name not in LAUNCHERS:
            raise ValueError(f"launcher.name={self.name!r} is unknown; allowed: {list(LAUNCHERS)}")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise ValueError(f"launcher.nproc_per_node={self.nproc_per_node} must be >= 1")
        if self.nnodes < 1:
            raise ValueError(f"launcher.nnodes={self.nnodes} must be >= 1")
        if self.name == "local" and self.nnodes != 1:
            raise ValueError(f"launcher.nnodes={self.nnodes}: launcher=local starts workers on this machine only; "
                             "for several nodes use launch/multinode.sh (torchrun, launcher=torchrun)")

    @property
    def world_size(self) -> int | None:
        return None if self.nproc_per_node is None else self.nproc_per_node * self.nnodes


@dataclass
class TrainConfig:
    algorithm: Any = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    run_dir: str | None = None
    resume: bool = True  # continue from the newest complete checkpoint in run_dir
    experiment: str | None = None


def _typed(cls: type, values: dict[str, Any], where: str):
    """Build dataclass `cls` from a plain dict; unknown keys and bad types fail naming the field."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(known)}")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), values))


def config_from_dict(raw: dict[str, Any]) -> TrainConfig:
    """The recipe's one conversion: a resolved plain dict (from Hydra) to typed dataclasses."""
    raw = dict(raw)
    algo_raw = dict(raw.pop("algorithm", None) or {"name": "ddp"})
    algo_cls = ALGORITHMS.get(algo_raw.get("name", "ddp"))
    sections = {f.name: f for f in fields(TrainConfig)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ValueError(f"unknown top-level config key(s) {unknown}; allowed: {sorted(sections)}")
    kwargs: dict[str, Any] = {"algorithm": _typed(algo_cls.config_cls, algo_raw, "algorithm")}
    for name in ("model", "data", "logger", "launcher", "optim", "train", "engine"):
        cls = type(sections[name].default_factory())
        kwargs[name] = _typed(cls, dict(raw.get(name) or {}), name)
    for name in ("run_dir", "resume", "experiment"):
        if name in raw:
            kwargs[name] = raw[name]
    return TrainConfig(**kwargs)


def check_data_fits(cfg: TrainConfig) -> None:
    """The built-in corpus has room for one global batch of `seq_len` blocks (hf sources are checked by the workers)."""
    if cfg.data.source != "offline":
        return
    from decentrain.data.blocks import build_corpus
    from decentrain.models.factory import build_tokenizer

    try:
        corpus = build_corpus(cfg.data, build_tokenizer(cfg.model))
    except ValueError as e:  # e.g. seq_len longer than a domain: too few blocks to split
        raise ValueError(f"data.seq_len={cfg.data.seq_len}: {e}") from None
    n = len(corpus.train_blocks())
    if cfg.train.global_batch_size > n:
        raise ValueError(f"train.global_batch_size={cfg.train.global_batch_size} must be <= the {n} training blocks of "
                         f"data.seq_len={cfg.data.seq_len} tokens; lower it or raise data.max_bytes_per_domain")


def check_run_dir(run_dir: str | None) -> None:
    if run_dir is None:
        return
    for p in (Path(run_dir), *Path(run_dir).parents):
        if p.exists() and not p.is_dir():
            raise ValueError(f"run_dir={run_dir}: {p} is a file; allowed: a directory (existing or new)")


def validate(cfg: TrainConfig, world_size: int) -> None:
    """Checks that need the world size or the data; run before any process group starts."""
    check_run_dir(cfg.run_dir)
    check_data_fits(cfg)
    expected = cfg.launcher.world_size
    if expected is not None and expected != world_size:
        raise ValueError(
            f"launcher.nproc_per_node={cfg.launcher.nproc_per_node} x launcher.nnodes={cfg.launcher.nnodes} "
            f"expects world size {expected}, but this run has {world_size}; "
            "set them to match, or use launcher=torchrun to accept torchrun's layout"
        )
    per_step = world_size * cfg.train.micro_batch_size
    if cfg.train.global_batch_size % per_step:
        raise ValueError(
            f"train.global_batch_size={cfg.train.global_batch_size} does not divide into world_size={world_size} "
            f"x train.micro_batch_size={cfg.train.micro_batch_size}; use a multiple of {per_step}"
        )
    shards = cfg.engine.shards_per_replica
    if world_size % shards:
        raise ValueError(f"engine.shards_per_replica={shards} does not divide world size {world_size} into replicas")
    if cfg.engine.name != "torch" and cfg.algorithm.name == "ddp":
        raise ValueError(f"engine.name={cfg.engine.name!r} shards inside replicas that an outer algorithm syncs; "
                         "algorithm=ddp already averages every step: use engine=torch, or algorithm=diloco/noloco")
    # the outer algorithm sees one rank per replica
    algorithm = ALGORITHMS.get(cfg.algorithm.name)
    algorithm.check_world(cfg.algorithm, world_size // shards)
    algorithm.check_steps(cfg.algorithm, cfg.train.steps)


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore; conf/ YAML files extend them (`<name>_schema`)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name in ALGORITHMS.names():
        cs.store(group="algorithm", name=f"{name}_schema", node=ALGORITHMS.get(name).config_cls)
    for group, cls in (("model", ModelConfig), ("data", DataConfig), ("logger", LoggerConfig), ("launcher", LauncherConfig),
                       ("engine", EngineConfig)):
        cs.store(group=group, name=f"{group}_schema", node=cls)
