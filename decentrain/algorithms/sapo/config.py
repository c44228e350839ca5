"""Typed configuration of a SAPO node and of the SFT warm start; Hydra schemas registered here.

A swarm shares one config; `nodes[i]` overrides sections for node i (its own model family and
size, tokenizer, task mix, template or I/J split), so one file describes a heterogeneous swarm.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from decentrain.algorithms.sapo.batching import SwarmBatchConfig
from decentrain.algorithms.sapo.config_checks import check_sapo_values
from decentrain.algorithms.sapo.evaluation import RLEvalConfig
from decentrain.algorithms.sapo.exchange import EXCHANGES, ExchangeConfig
from decentrain.algorithms.sapo.grpo import SAPOLossConfig
from decentrain.algorithms.sapo.payload import PayloadLimits, check_swarm_key
from decentrain.algorithms.sapo.sampling import SamplingConfig
from decentrain.core.identity import check_node_name
from decentrain.core.metrics import LoggerConfig
from decentrain.core.typed import typed
from decentrain.core.world import DEVICES
from decentrain.models.factory import BYTE_TOKENIZER, ModelConfig
from decentrain.tasks import RewardConfig, TaskMixConfig, TemplateConfig

PRECISIONS = ("auto", "fp32", "bf16_autocast")

# Sections a node may override; each override is a dict of that section's fields.
NODE_SECTIONS = ("model", "task", "template", "reward", "sampling", "batch", "optim")


@dataclass
class RLOptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    grad_clip: float = 1.0  # 0 disables clipping

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr={self.lr} must be > 0")
        if len(self.betas) != 2:
            raise ValueError(f"optim.betas={self.betas} must have two entries")


@dataclass
class RLLoopConfig:
    rounds: int = 100
    questions_per_round: int | None = None  # None: batch.num_local, at least 1 (a node with I=0 still shares)
    # SPO's prioritised prompt sampling (needs loss.advantage="spo"): draw `candidates_factor` x the
    # questions, keep a subset weighted by sqrt(v(1-v)) + eps, favouring prompts the policy is unsure of.
    prioritized_sampling: bool = False
    candidates_factor: int = 4
    micro_batch_size: int = 32  # completions per forward/backward
    max_prompt_tokens: int = 256
    checkpoint_every: int = 50  # rounds; 0 disables
    keep_checkpoints: int = 2
    seed: int = 0
    threads: int | None = None
    stop_at: int | None = None  # leave after this round, as a preempted job would (resume continues)
    device: str = "auto"  # auto | cpu | cuda (nodes sharing a GPU talk over gloo)
    # the policy step's matmuls: auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16_autocast;
    # master weights and AdamW state stay in model.dtype (generation has its own sampling.dtype)
    precision: str = "auto"

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"train.device={self.device!r} is unknown; allowed: {list(DEVICES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision={self.precision!r} is unknown; allowed: {list(PRECISIONS)}")
        for name in ("rounds", "micro_batch_size", "max_prompt_tokens", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name}={getattr(self, name)} must be >= 1")
        if self.questions_per_round is not None and self.questions_per_round < 1:
            raise ValueError(f"train.questions_per_round={self.questions_per_round} must be >= 1")
        if self.candidates_factor < 1:
            raise ValueError(f"train.candidates_factor={self.candidates_factor} must be >= 1")
        if self.checkpoint_every < 0:
            raise ValueError(f"train.checkpoint_every={self.checkpoint_every} must be >= 0")
        if self.stop_at is not None and not 1 <= self.stop_at <= self.rounds:
            raise ValueError(f"train.stop_at={self.stop_at} must be in [1, train.rounds={self.rounds}]")


@dataclass
class NodeOverride:
    """Per-node overrides: `{section: {field: value}}`, e.g. {"model": {"hidden_size": 256}}."""

    model: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=dict)
    template: dict[str, Any] = field(default_factory=dict)
    reward: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    batch: dict[str, Any] = field(default_factory=dict)
    optim: dict[str, Any] = field(default_factory=dict)


@dataclass
class SAPOConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskMixConfig = field(default_factory=TaskMixConfig)
    template: TemplateConfig = field(default_factory=TemplateConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=16))
    loss: SAPOLossConfig = field(default_factory=SAPOLossConfig)
    batch: SwarmBatchConfig = field(default_factory=SwarmBatchConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    payload: PayloadLimits = field(default_factory=PayloadLimits)
    optim: RLOptimConfig = field(default_factory=RLOptimConfig)
    train: RLLoopConfig = field(default_factory=RLLoopConfig)
    eval: RLEvalConfig = field(default_factory=RLEvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    nodes: list[NodeOverride] = field(default_factory=list)
    node_index: int | None = None  # which `nodes` entry and seed this process is; None: its rank
    node_id: str | None = None  # this node's name (logs, run dirs); None: "node<index>". Its wire id is its public key
    # This node's Ed25519 key file (created on first run, kept so a restarted node keeps its id);
    # "{node}" is replaced by the node's name. None: <run_dir>/<node name>/node.key.
    key_file: str | None = None
    # Membership gate: an HMAC key shared by the swarm; payloads without it are dropped. null: open swarm.
    swarm_key: str | None = None
    num_nodes: int = 1  # processes the recipe starts here for `collective` (torchrun ranks)
    run_dir: str | None = None
    resume: bool = True

    def __post_init__(self) -> None:
        EXCHANGES.get(self.exchange.name, field="exchange.name")
        check_sapo_values(self)  # every number finite and in range (config_checks: one function per section)
        if self.payload.num_generations != self.loss.num_generations:
            raise ValueError(
                f"payload.num_generations={self.payload.num_generations} must equal "
                f"loss.num_generations={self.loss.num_generations}"
            )
        self._check_completion_length()
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes={self.num_nodes} must be >= 1")
        if self.node_index is not None and self.node_index < 0:
            raise ValueError(f"node_index={self.node_index} must be >= 0")
        if self.node_id is not None and (why := check_node_name(self.node_id)) is not None:
            raise ValueError(f"node_id {why}")
        if self.key_file is not None and self.num_nodes > 1 and "{node}" not in self.key_file:
            raise ValueError(f"key_file={self.key_file!r} must contain '{{node}}' when num_nodes={self.num_nodes} > 1")
        try:
            check_swarm_key(self.swarm_key)
        except ValueError as e:
            raise ValueError(f"{e} (got {self.swarm_key!r})") from None
        self._check_batch(self.batch, "batch")
        check_template_model(self.template, self.model)
        if self.train.prioritized_sampling and self.loss.advantage != "spo":
            raise ValueError(f"train.prioritized_sampling=True needs loss.advantage='spo', not {self.loss.advantage!r}")
        for i in range(len(self.nodes)):
            try:
                self.for_node(i)  # resolve every override now: bad ones fail before start
            except ValueError as e:
                msg = str(e)
                raise ValueError(msg if msg.startswith("nodes[") else f"nodes[{i}].{msg}") from None

    def _check_completion_length(self) -> None:
        """One completion length: dr_grpo's normaliser is the generation cap, as in TRL."""
        cap = self.sampling.max_new_tokens
        if self.loss.max_completion_length is None:
            self.loss = dataclasses.replace(self.loss, max_completion_length=cap)
        elif self.loss.max_completion_length != cap:
            raise ValueError(
                f"loss.max_completion_length={self.loss.max_completion_length} must equal "
                f"sampling.max_new_tokens={cap} (or be null to follow it)"
            )

    def _check_batch(self, batch: SwarmBatchConfig, where: str) -> None:
        if not EXCHANGES.get(self.exchange.name).has_peers and batch.num_external > 0:
            raise ValueError(
                f"{where}.num_external={batch.num_external} must be 0 with "
                f"exchange.name={self.exchange.name!r} (no peers)"
            )

    def for_node(self, index: int) -> SAPOConfig:
        """This config with `nodes[index]`'s overrides applied (unchanged past the list's end)."""
        if index >= len(self.nodes):
            return self
        override = self.nodes[index]
        if not isinstance(override, NodeOverride):
            override = NodeOverride(**override)
        changes: dict[str, Any] = {}
        for section in NODE_SECTIONS:
            values = getattr(override, section)
            if not values:
                continue
            base = getattr(self, section)
            known = {f.name for f in dataclasses.fields(base)}
            unknown = sorted(set(values) - known)
            if unknown:
                raise ValueError(f"nodes[{index}].{section}: unknown field(s) {unknown}; allowed: {sorted(known)}")
            try:
                changes[section] = dataclasses.replace(base, **values)
            except (TypeError, ValueError) as e:  # TypeError: a value of the wrong type met a comparison
                raise ValueError(f"nodes[{index}].{section}: {e}") from None
        if "batch" in changes:
            self._check_batch(changes["batch"], f"nodes[{index}].batch")
        if "template" in changes or "model" in changes:
            check_template_model(
                changes.get("template", self.template), changes.get("model", self.model), f"nodes[{index}]."
            )
        if "sampling" in changes:  # the loss normaliser follows this node's own generation cap
            changes["loss"] = dataclasses.replace(self.loss, max_completion_length=None)
        return dataclasses.replace(self, nodes=[], **changes) if changes else dataclasses.replace(self, nodes=[])


def check_template_model(template: TemplateConfig, model: ModelConfig, where: str = "") -> None:
    """A chat template needs a tokenizer that has one: the byte tokenizer of the tiny models has none."""
    if template.chat and model.tokenizer == BYTE_TOKENIZER:
        raise ValueError(
            f"{where}template.chat=true needs a tokenizer with a chat template; {where}model.tokenizer="
            f"{BYTE_TOKENIZER!r} has none (model=smollm2_135m_instruct has one)"
        )


@dataclass
class SFTLoopConfig:
    steps: int = 450
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    log_every: int = 50
    seed: int = 0
    threads: int | None = None
    device: str = "auto"  # auto | cpu | cuda

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"sft.device={self.device!r} is unknown; allowed: {list(DEVICES)}")
        for name in ("steps", "batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"sft.lr={self.lr} must be > 0")


@dataclass
class SFTEvalConfig:
    prompts_per_task: int = 48
    num_generations: int = 4
    seed_offset: int = 1000  # eval questions come from task.seed + seed_offset: unseen in training

    def __post_init__(self) -> None:
        if self.prompts_per_task < 1 or self.num_generations < 1:
            raise ValueError("eval.prompts_per_task and eval.num_generations must be >= 1")


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskMixConfig = field(default_factory=TaskMixConfig)
    template: TemplateConfig = field(default_factory=TemplateConfig)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(max_new_tokens=16))
    sft: SFTLoopConfig = field(default_factory=SFTLoopConfig)
    eval: SFTEvalConfig = field(default_factory=SFTEvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    out_dir: str | None = None  # where the save_pretrained checkpoint goes; None: <run_dir>/model
    run_dir: str | None = None

    def __post_init__(self) -> None:
        check_template_model(self.template, self.model)


def sapo_config_from_dict(raw: dict[str, Any]) -> SAPOConfig:
    """Hydra's resolved dict to SAPOConfig; every error names its field (`config error:` in the recipe).

    Each section is built on its own first, so a section's own check that names only the field
    (`epsilon=nan ...`) is reported with its section (`loss.epsilon=nan ...`).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    defaults = SAPOConfig.__dataclass_fields__
    unknown = sorted(set(raw) - set(defaults))
    if unknown:
        raise ValueError(f"unknown top-level config key(s) {unknown}; allowed: {sorted(defaults)}")
    for name, f in defaults.items():
        if name not in raw or f.default_factory is dataclasses.MISSING:
            continue
        default = f.default_factory()
        if not dataclasses.is_dataclass(default):
            continue
        try:
            OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(default), raw[name] or {}))
        except ValueError as e:
            msg = " ".join(str(e).split())
            raise ValueError(msg if msg.startswith(f"{name}.") else f"{name}.{msg}") from None
        except OmegaConfBaseException as e:  # a wrong type or unknown field: OmegaConf names it
            raise ValueError(f"{name}.{getattr(e, 'full_key', '') or '?'}: {' '.join(str(e).split()[:12])}") from None
    try:
        return typed(SAPOConfig, raw)  # the one conversion every recipe ends in (core/typed.py)
    except OmegaConfBaseException as e:
        raise ValueError(f"{getattr(e, 'full_key', '') or 'config'}: {' '.join(str(e).split()[:12])}") from None
