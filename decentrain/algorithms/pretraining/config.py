"""The typed configuration of one pre-training run of the shared loop, and its checks.

`LoopConfig` (the `train` section) configures the `Trainer`; `TrainConfig` assembles it
with the sections of what the run builds, each defined next to its code (ModelConfig in
models/, DataConfig in data/, OptimConfig and EngineConfig in pretraining/engines/,
LauncherConfig in core/launch/, TransportConfig in pretraining/transports/, each
algorithm's config in its package). decentrain/config.py, the composition root above,
converts Hydra's dict into these and registers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentrain.algorithms.base import ALGORITHMS, AlgorithmConfig
from decentrain.algorithms.pretraining.engines import ENGINES, EngineConfig, OptimConfig
from decentrain.algorithms.pretraining.precision import COMPILE_SCOPES, PRECISIONS
from decentrain.algorithms.pretraining.transports.base import TransportConfig, transport_spec
from decentrain.core.config_checks import check_range
from decentrain.core.launch.config import LauncherConfig
from decentrain.core.metrics import LoggerConfig
from decentrain.core.world import DEVICES
from decentrain.data.blocks import DataConfig, build_corpus, builds_locally, check_data_files
from decentrain.models.factory import ModelConfig, build_tokenizer, check_model_paths


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
    tf32: bool = True  # CUDA: fp32 matmuls on TF32 tensor cores (precision.set_tf32); false keeps IEEE fp32

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"train.device={self.device!r} is unknown; allowed: {list(DEVICES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision={self.precision!r} is unknown; allowed: {list(PRECISIONS)}")
        if self.compile not in COMPILE_SCOPES:
            raise ValueError(f"train.compile={self.compile!r} is unknown; allowed: {list(COMPILE_SCOPES)}")
        if self.stop_at is not None and not 1 <= self.stop_at <= self.steps:
            raise ValueError(f"train.stop_at={self.stop_at} must be in [1, train.steps={self.steps}]")
        for f in (
            "steps",
            "global_batch_size",
            "micro_batch_size",
            "eval_every",
            "eval_batches",
            "checkpoint_every",
            "keep_checkpoints",
        ):
            if getattr(self, f) < 1:
                raise ValueError(f"train.{f}={getattr(self, f)} must be >= 1")
        check_range("train.seed", self.seed, 0, 2**32 - 1)  # numpy's seed range
        check_range("train.threads", self.threads, 1, 1024, none_ok=True)


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
    # how replicas reach each other: its spec's own config class
    transport: Any = field(default_factory=TransportConfig)
    run_dir: str | None = None
    resume: bool = True  # continue from the newest complete checkpoint in run_dir
    experiment: str | None = None


def check_data_fits(cfg: TrainConfig) -> None:
    """A corpus built on this machine (offline, local files) has room for one global batch of `seq_len`
    blocks (hub datasets are checked by the workers)."""
    check_data_files(cfg.data)
    if not builds_locally(cfg.data):
        return
    try:
        corpus = build_corpus(cfg.data, build_tokenizer(cfg.model))
    except ValueError as e:  # e.g. seq_len longer than a domain: too few blocks to split
        raise ValueError(f"data.seq_len={cfg.data.seq_len}: {e}") from None
    n = len(corpus.train_blocks())
    if cfg.train.global_batch_size > n:
        raise ValueError(
            f"train.global_batch_size={cfg.train.global_batch_size} must be <= the {n} training blocks of "
            f"data.seq_len={cfg.data.seq_len} tokens; lower it or raise data.max_bytes_per_domain"
        )


def check_run_dir(run_dir: str | None) -> None:
    if run_dir is None:
        return
    for p in (Path(run_dir), *Path(run_dir).parents):
        if p.exists() and not p.is_dir():
            raise ValueError(f"run_dir={run_dir}: {p} is a file; allowed: a directory (existing or new)")


def validate(cfg: TrainConfig, world_size: int) -> None:
    """Checks that need the world size or the data; run before any process group starts."""
    check_run_dir(cfg.run_dir)
    check_model_paths(cfg.model)  # a mistyped path fails here, not after the workers' hub retries
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
    # the outer algorithm sees one rank per replica
    algorithm = ALGORITHMS.get(cfg.algorithm.name)
    if ENGINES.get(cfg.engine.name).shards_replica and algorithm.syncs_every_step:
        raise ValueError(
            f"engine.name={cfg.engine.name!r} shards inside replicas that an outer algorithm syncs; "
            f"algorithm={cfg.algorithm.name} already averages every step: use engine=torch, "
            "or an outer algorithm (diloco, noloco)"
        )
    algorithm.check_world(cfg.algorithm, world_size // shards)
    algorithm.check_steps(cfg.algorithm, cfg.train.steps)
    transport_spec(cfg).check(cfg, world_size)  # what the selected transport cannot carry
