"""Tiny configs for tests: a SAPO node (a 2-layer byte Llama, G=4, 2+2 groups, 4 new tokens), an HDEE
plan with hand-saved experts (no training needed), and a single-process pre-training `Trainer`."""

from __future__ import annotations

from pathlib import Path

import torch

from decentrain.algorithms.hdee.config import BudgetConfig, EvalConfig, HdeeConfig
from decentrain.algorithms.hdee.plan import EnsemblePlan, LaneConfig, SeedConfig
from decentrain.algorithms.hdee.train import model_dir
from decentrain.algorithms.sapo.batching import SwarmBatchConfig
from decentrain.algorithms.sapo.config import RLLoopConfig, RLOptimConfig, SAPOConfig
from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig
from decentrain.algorithms.sapo.grpo import SAPOLossConfig
from decentrain.algorithms.sapo.payload import PayloadLimits
from decentrain.algorithms.sapo.sampling import SamplingConfig
from decentrain.config import LoopConfig, OptimConfig
from decentrain.core.metrics import LoggerConfig
from decentrain.data.blocks import DataConfig
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model
from decentrain.tasks import TaskMixConfig

# -- SAPO -------------------------------------------------------------------------------------------

TINY_MODEL = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_seq_len=256)
EASY_TASKS = dict(
    tasks=["chain_sum", "basic_arithmetic"],
    size=200,
    task_kwargs={
        "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
        "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    },
)


def tiny_sapo_config(
    exchange: str = "silo",
    num_local: int = 2,
    num_external: int = 0,
    rounds: int = 2,
    hivemind: HivemindConfig | None = None,
    **kwargs,
) -> SAPOConfig:
    return SAPOConfig(
        model=ModelConfig(**TINY_MODEL),
        task=TaskMixConfig(**EASY_TASKS),
        sampling=SamplingConfig(max_new_tokens=4, temperature=1.0),
        loss=SAPOLossConfig(num_generations=4),
        payload=PayloadLimits(num_generations=4),
        batch=SwarmBatchConfig(num_local, num_external),
        exchange=ExchangeConfig(name=exchange, hivemind=hivemind or HivemindConfig()),
        optim=RLOptimConfig(lr=1e-3),
        train=RLLoopConfig(rounds=rounds, micro_batch_size=8, max_prompt_tokens=96, checkpoint_every=1, threads=1),
        logger=LoggerConfig(progress=False, console=False),
        **kwargs,
    )


class FixedExchange:
    """Hands a node the same raw (source, bytes) records every round, whatever it publishes."""

    def __init__(self, records):
        self.records = records

    def exchange(self, round_, payload, is_valid=None, ends_wait=None):
        from decentrain.algorithms.sapo.exchange import PeerRecord

        return [PeerRecord(source, data) for source, data in self.records]

    def close(self):
        pass


# -- HDEE -------------------------------------------------------------------------------------------

WIDTHS = (48, 64, 80)  # S/M/L FFN widths of the tiny model
DOMAINS = ["licenses", "arithmetic", "python_docs"]


def tiny_hdee_config(ensemble_dir: Path, widths=WIDTHS, steps: int = 2, **eval_kw) -> HdeeConfig:
    seeds = [
        SeedConfig(name=f"seed-{w}", size=f"w{w}", intermediate_size=w, steps=steps, domains=["python_docs"])
        for w in sorted(set(widths))
    ]
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


# -- a single-process Trainer (4-layer Llama, one small domain) for unit tests of the loop ----------

TRAINER_MODEL = ModelConfig(hidden_size=16, num_layers=4, num_heads=2, intermediate_size=32, max_seq_len=32)


def tiny_trainer(tmp_path, world=None, **train):
    from decentrain.algorithms.ddp.ddp import DDP
    from decentrain.algorithms.pretraining.trainer import Trainer
    from decentrain.config import TrainConfig
    from decentrain.core.world import World
    from decentrain.data.blocks import build_corpus

    loop = {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2, "eval_batches": 2, **train}
    cfg = TrainConfig(
        model=TRAINER_MODEL,
        data=DataConfig(domains=["licenses"], seq_len=32, max_bytes_per_domain=20_000),
        train=LoopConfig(**loop),
    )
    tok = build_tokenizer(cfg.model)
    world = world or World()
    return Trainer(
        cfg.train,
        world,
        DDP(cfg.algorithm, world),
        build_model(cfg.model, tok),
        build_corpus(cfg.data, tok),
        tmp_path,
        engine=cfg.engine,
        optim=cfg.optim,
        logger=cfg.logger,
    )
