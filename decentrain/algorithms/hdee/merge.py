"""Build the routed model of an HDEE ensemble from its trained experts (the `hdee_merge` recipe's job).

Experts come from an ensemble dir (its saved plan: the seed is the router backbone, each lane's
final expert routes the lane's domains) or are named one by one. The router's calibration set
is the first `calibration_blocks` blocks of each expert domain's `calibration_split` (validation
by default, never the test split), each block labelled with its domain's expert.

Every model is checked before use (hdee/checkpoints.py): `check_merge` reads the configs and
tokenizers only (sources exist, sizes fit, one vocabulary and tokenizer, `router_layer` names a
hidden state), then `build_routed` loads each model whole and `merge` refuses non-finite weights.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decentrain.algorithms.hdee.checkpoints import (
    CheckpointError,
    check_fits,
    check_tokenizer,
    check_vocab,
    load_model,
    model_bytes,
    read_config,
    read_tokenizer,
)
from decentrain.algorithms.hdee.config import load_saved_config
from decentrain.algorithms.hdee.routed import POOLINGS, RoutedExpertsForCausalLM, merge
from decentrain.algorithms.hdee.train import model_dir
from decentrain.core.config_checks import check_range
from decentrain.data.blocks import SPLITS, DataConfig, build_corpus
from decentrain.models.factory import save_model

log = logging.getLogger(__name__)


@dataclass
class ExpertSource:
    name: str = ""
    path: str = ""  # a save_pretrained directory
    domains: list[str] = field(default_factory=list)  # the domains routed to it (its calibration labels)


@dataclass
class MergeConfig:
    ensemble_dir: str | None = None  # a trained HDEE ensemble: fills `backbone` and `experts` from its plan
    backbone: str | None = None  # router features: the experts' common seed (save_pretrained dir)
    experts: list[ExpertSource] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    calibration_split: str = "val"
    calibration_blocks: int = 8  # per domain: the "small calibration set"
    ridge_lambda: float = 1.0
    router_layer: int = -1  # which hidden state of the backbone (-1: the last, after its final norm)
    pooling: str = "running_mean"
    batch_size: int = 16
    out_dir: str | None = None  # None: <ensemble_dir>/routed

    def __post_init__(self) -> None:
        if self.calibration_split not in SPLITS or self.calibration_split == "test":
            raise ValueError(
                f"calibration_split={self.calibration_split!r} must be 'train' or 'val' (never the test split)"
            )
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r} is unknown; allowed: {list(POOLINGS)}")
        if self.calibration_blocks < 1:
            raise ValueError(f"calibration_blocks={self.calibration_blocks} must be >= 1")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        check_range("ridge_lambda", self.ridge_lambda, 0, None, low_open=True)  # NaN and inf too: W would be NaN
        if not self.ensemble_dir and (not self.backbone or not self.experts):
            raise ValueError("ensemble_dir is unset: name backbone and experts (name, path, domains) instead")
        check_experts(self.experts)


def check_experts(experts: list[ExpertSource]) -> None:
    """Each expert named once (the router's columns are keyed by name), with a path and domains to calibrate on."""
    seen: set[str] = set()
    for i, e in enumerate(experts):
        if not e.name or not e.path or not e.domains:
            raise ValueError(
                f"experts[{i}] needs a name, a path and domains (got name={e.name!r}, path={e.path!r}, "
                f"domains={e.domains})"
            )
        if e.name in seen:
            raise ValueError(f"experts[{i}].name={e.name!r} names two experts; each expert needs its own name")
        seen.add(e.name)


def from_ensemble(cfg: MergeConfig) -> MergeConfig:
    """Backbone, experts and corpus settings from an ensemble dir's saved plan (hdee.yaml): the lanes' seed,
    each lane's final expert routing the lane's domains."""
    if not cfg.ensemble_dir or (cfg.backbone and cfg.experts):
        return cfg
    saved = load_saved_config(cfg.ensemble_dir)
    if saved is None:
        raise ValueError(f"ensemble_dir={cfg.ensemble_dir!r} has no hdee.yaml; name backbone and experts instead")
    seeds = {lane.seed for lane in saved.plan.lanes}
    if len(seeds) != 1:
        raise ValueError(
            f"ensemble_dir={cfg.ensemble_dir!r}: lanes branch from {sorted(seeds)}; one backbone routes "
            "experts of one seed only (name backbone and experts instead)"
        )
    experts = [
        ExpertSource(n, str(model_dir(cfg.ensemble_dir, n)), list(lane.domains))
        for n, lane in zip(saved.plan.final_experts(), saved.plan.lanes)
    ]
    # The ensemble's own corpus settings: the same validation blocks the experts were split from.
    return dataclasses.replace(
        cfg,
        backbone=cfg.backbone or str(model_dir(cfg.ensemble_dir, seeds.pop())),
        data=saved.data,
        experts=cfg.experts or experts,
        out_dir=cfg.out_dir or str(Path(cfg.ensemble_dir) / "routed"),
    )


def calibration_blocks(cfg: MergeConfig, tokenizer) -> dict[str, torch.Tensor]:
    """{expert name: [N, T] blocks}: `calibration_blocks` of each of its domains' calibration split."""
    domains = [d for e in cfg.experts for d in e.domains]
    corpus = build_corpus(dataclasses.replace(cfg.data, domains=domains), tokenizer)
    return {
        e.name: torch.cat([corpus.split(cfg.calibration_split, d)[: cfg.calibration_blocks] for d in e.domains])
        for e in cfg.experts
    }


def check_merge(cfg: MergeConfig, memory: int | None = None):
    """Everything that can be checked before any weights are read: the backbone and every expert exist,
    are causal LMs that fit in `memory` bytes together (default: this machine's), share the backbone's
    vocabulary and tokenizer, and `router_layer` names one of the backbone's hidden states.
    Returns the backbone's tokenizer; raises CheckpointError (one line) otherwise."""
    cfg = from_ensemble(cfg)
    check_experts(cfg.experts)  # from_ensemble filled them
    backbone = read_config(cfg.backbone, "backbone")
    tokenizer = read_tokenizer(cfg.backbone, "backbone")
    total = model_bytes(backbone, "backbone")
    layers = backbone.num_hidden_layers  # hidden_states holds the embeddings and every layer's output
    if not -(layers + 1) <= cfg.router_layer <= layers:
        raise CheckpointError(
            f"router_layer={cfg.router_layer} names no hidden state of the backbone "
            f"({layers} layers: allowed {-(layers + 1)} to {layers})"
        )
    if len(tokenizer) > backbone.vocab_size:
        raise CheckpointError(
            f"backbone: its tokenizer has {len(tokenizer)} tokens, its vocab_size is {backbone.vocab_size}"
        )
    for i, e in enumerate(cfg.experts):
        where = f"experts[{i}] ({e.name})"
        config = read_config(e.path, f"experts[{i}].path")
        check_vocab(config, backbone.vocab_size, where)
        check_tokenizer(read_tokenizer(e.path, f"experts[{i}].path"), tokenizer, where)
        total += model_bytes(config, where)
    check_fits(total, "the backbone and experts", memory)
    return tokenizer


def build_routed(cfg: MergeConfig, tokenizer=None) -> tuple[RoutedExpertsForCausalLM, object]:
    """The routed model (and the experts' tokenizer), router fit on the calibration set; `tokenizer`:
    `check_merge`'s answer, when the caller ran it already."""
    cfg = from_ensemble(cfg)
    tokenizer = tokenizer if tokenizer is not None else check_merge(cfg)
    calib = calibration_blocks(cfg, tokenizer)
    backbone = load_model(cfg.backbone, "backbone")
    experts = {e.name: load_model(e.path, f"experts[{i}] ({e.name})") for i, e in enumerate(cfg.experts)}
    model = merge(
        backbone,
        experts,
        calib,
        ridge_lambda=cfg.ridge_lambda,
        router_layer=cfg.router_layer,
        pooling=cfg.pooling,
        batch_size=cfg.batch_size,
    )
    return model, tokenizer


def save_routed(model: RoutedExpertsForCausalLM, tokenizer, out_dir: str | Path) -> Path:
    """save_pretrained (safetensors) of the routed model and the experts' tokenizer."""
    out = save_model(model, tokenizer, out_dir)
    log.info(f"[hdee] routed model saved to {out}")
    return out
