"""Build the routed model of an HDEE ensemble from its trained experts (the `hdee_merge` recipe's job).

Experts come from an ensemble dir (its saved plan: the seed is the router backbone, each lane's
final expert routes the lane's domains) or are named one by one. The router's calibration set
is the first `calibration_blocks` blocks of each expert domain's `calibration_split` (validation
by default, never the test split), each block labelled with its domain's expert.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decentrain.algorithms.hdee.config import load_saved_config
from decentrain.algorithms.hdee.routed import POOLINGS, RoutedExpertsForCausalLM, merge
from decentrain.algorithms.hdee.train import model_dir
from decentrain.data.blocks import SPLITS, DataConfig, build_corpus
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model

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
            raise ValueError(f"calibration_split={self.calibration_split!r} must be 'train' or 'val' (never the test split)")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling={self.pooling!r} is unknown; allowed: {list(POOLINGS)}")
        if self.calibration_blocks < 1:
            raise ValueError(f"calibration_blocks={self.calibration_blocks} must be >= 1")
        if self.ridge_lambda <= 0:
            raise ValueError(f"ridge_lambda={self.ridge_lambda} must be > 0")
        if not self.ensemble_dir and (not self.backbone or not self.experts):
            raise ValueError("ensemble_dir is unset: name backbone and experts (name, path, domains) instead")


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
        raise ValueError(f"ensemble_dir={cfg.ensemble_dir!r}: lanes branch from {sorted(seeds)}; one backbone routes "
                         "experts of one seed only (name backbone and experts instead)")
    experts = [ExpertSource(n, str(model_dir(cfg.ensemble_dir, n)), list(lane.domains))
               for n, lane in zip(saved.plan.final_experts(), saved.plan.lanes)]
    # The ensemble's own corpus settings: the same validation blocks the experts were split from.
    return dataclasses.replace(cfg, backbone=cfg.backbone or str(model_dir(cfg.ensemble_dir, seeds.pop())), data=saved.data,
                               experts=cfg.experts or experts, out_dir=cfg.out_dir or str(Path(cfg.ensemble_dir) / "routed"))


def calibration_blocks(cfg: MergeConfig, tokenizer) -> dict[str, torch.Tensor]:
    """{expert name: [N, T] blocks}: `calibration_blocks` of each of its domains' calibration split."""
    domains = [d for e in cfg.experts for d in e.domains]
    corpus = build_corpus(dataclasses.replace(cfg.data, domains=domains), tokenizer)
    return {e.name: torch.cat([corpus.split(cfg.calibration_split, d)[: cfg.calibration_blocks] for d in e.domains])
            for e in cfg.experts}


def _load(path: str):
    return build_model(ModelConfig(pretrained=path)).eval()


def build_routed(cfg: MergeConfig) -> tuple[RoutedExpertsForCausalLM, object]:
    """The routed model (and the experts' tokenizer), router fit on the calibration set."""
    cfg = from_ensemble(cfg)
    tokenizer = build_tokenizer(ModelConfig(tokenizer=cfg.backbone))
    calib = calibration_blocks(cfg, tokenizer)
    model = merge(_load(cfg.backbone), {e.name: _load(e.path) for e in cfg.experts}, calib, ridge_lambda=cfg.ridge_lambda,
                  router_layer=cfg.router_layer, pooling=cfg.pooling)
    return model, tokenizer


def save_routed(model: RoutedExpertsForCausalLM, tokenizer, out_dir: str | Path) -> Path:
    """save_pretrained (safetensors) of the routed model and the experts' tokenizer."""
    out = save_model(model, tokenizer, out_dir)
    log.info(f"[hdee] routed model saved to {out}")
    return out
