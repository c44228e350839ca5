"""A tiny single-process `Trainer` (4-layer Llama, one small domain) for unit tests of the loop."""

from __future__ import annotations

from decentrain.models.factory import ModelConfig, build_model

TINY = ModelConfig(hidden_size=16, num_layers=4, num_heads=2, intermediate_size=32, max_seq_len=32)


def tiny_trainer(tmp_path, world=None, **train):
    from decentrain.algorithms.common.trainer import Trainer
    from decentrain.algorithms.ddp.ddp import DDP
    from decentrain.config import LoopConfig, TrainConfig
    from decentrain.core.world import World
    from decentrain.data.blocks import DataConfig, build_corpus
    from decentrain.models.factory import build_tokenizer

    loop = {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2, "eval_batches": 2, **train}
    cfg = TrainConfig(model=TINY, data=DataConfig(domains=["licenses"], seq_len=32, max_bytes_per_domain=20_000),
                      train=LoopConfig(**loop))
    tok = build_tokenizer(cfg.model)
    world = world or World()
    return Trainer(cfg.train, world, DDP(cfg.algorithm, world), build_model(cfg.model, tok), build_corpus(cfg.data, tok), tmp_path,
                   engine=cfg.engine, optim=cfg.optim, logger=cfg.logger)
