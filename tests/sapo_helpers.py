"""A SAPO config small enough for tests: a 2-layer byte Llama, G=4, 2+2 groups, 4 new tokens."""

from __future__ import annotations

from decentrain.algorithms.sapo.batching import SwarmBatchConfig
from decentrain.algorithms.sapo.config import RLLoopConfig, RLOptimConfig, SAPOConfig
from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig
from decentrain.algorithms.sapo.generation import SamplingConfig
from decentrain.algorithms.sapo.grpo import SAPOLossConfig
from decentrain.algorithms.sapo.payload import PayloadLimits
from decentrain.core.metrics import LoggerConfig
from decentrain.models.factory import ModelConfig
from decentrain.tasks import TaskMixConfig

TINY_MODEL = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_seq_len=256)
EASY_TASKS = dict(tasks=["chain_sum", "basic_arithmetic"], size=200,
                  task_kwargs={"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
                               "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}})


def tiny_sapo_config(exchange: str = "silo", num_local: int = 2, num_external: int = 0, rounds: int = 2,
                     hivemind: HivemindConfig | None = None, **kwargs) -> SAPOConfig:
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

    def exchange(self, round_, payload, is_valid=None):
        from decentrain.algorithms.sapo.exchange import PeerRecord

        return [PeerRecord(source, data) for source, data in self.records]

    def close(self):
        pass
