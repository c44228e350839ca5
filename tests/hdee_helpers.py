"""Tiny HDEE configs and hand-saved expert checkpoints for tests (no training needed)."""

from __future__ import annotations

from pathlib import Path

import torch

from decentrain.algorithms.hdee.config import BudgetConfig, EvalConfig, HdeeConfig
from decentrain.algorithms.hdee.plan import EnsemblePlan, LaneConfig, SeedConfig
from decentrain.algorithms.hdee.train import model_dir
from decentrain.config import LoopConfig, OptimConfig
from decentrain.core.metrics import LoggerConfig
from decentrain.data.blocks import DataConfig
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model

WIDTHS = (48, 64, 80)  # S/M/L FFN widths of the tiny model
DOMAINS = ["licenses", "arithmetic", "python_docs"]


def tiny_cfg(ensemble_dir: Path, widths=WIDTHS, steps: int = 2, **eval_kw) -> HdeeConfig:
    seeds = [SeedConfig(name=f"seed-{w}", size=f"w{w}", intermediate_size=w, steps=steps, domains=["python_docs"]) for w in sorted(set(widths))]
    lanes = [
        LaneConfig(domains=[DOMAINS[i % 2]], steps=[steps], size=f"w{w}", intermediate_size=w, seed=f"seed-{w}")
        for i, w in enumerate(widths)
    ]
    eval_kw = {"max_blocks": 6, "batch_size": 4, "prior_sequences": 5, **eval_kw}
    return HdeeConfig(
        plan=EnsemblePlan(seeds=seeds, lanes=lanes, tokens_per_step=4 * 32),
        model=ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_seq_len=64),
        data=DataConfig(domains=list(DOMAINS), seq_len=32, max_bytes_per_domain=12_000),
        optim=OptimConfig(warmup_steps=1),
        train=LoopConfig(global_batch_size=4, micro_batch_size=4, eval_batches=1, eval_every=100, threads=1),
        logger=LoggerConfig(progress=False, console=False),
        budget=BudgetConfig(baseline_intermediate_size=64, baseline_steps_per_domain=steps),
        eval=EvalConfig(domains=["licenses", "arithmetic"], **eval_kw),
        ensemble_dir=str(ensemble_dir),
    )


def save_random_experts(cfg: HdeeConfig, tokenizer=None) -> list[Path]:
    """Each lane's final expert as a randomly initialised model of the lane's width."""
    tokenizer = tokenizer or build_tokenizer(cfg.model)
    out = []
    for i, (name, lane) in enumerate(zip(cfg.plan.final_experts(), cfg.plan.lanes)):
        torch.manual_seed(100 + i)
        model = build_model(cfg.model, tokenizer, intermediate_size=lane.intermediate_size)
        out.append(save_model(model, tokenizer, model_dir(cfg.ensemble_dir, name)))
    return out
