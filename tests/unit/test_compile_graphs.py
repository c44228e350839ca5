"""`train.compile=blocks` must not recompile per step: the loop's forwards build no KV cache."""

from __future__ import annotations

import torch

from decentrain.algorithms.common.speed import transformer_blocks
from decentrain.models.factory import ModelConfig, build_model

TINY = ModelConfig(hidden_size=16, num_layers=4, num_heads=2, intermediate_size=32, max_seq_len=32)


def _trainer(tmp_path, **train):
    from decentrain.algorithms.common.trainer import Trainer
    from decentrain.algorithms.ddp.ddp import DDP, DDPConfig  # noqa: F401
    from decentrain.config import LoopConfig, TrainConfig
    from decentrain.core.world import World
    from decentrain.data.blocks import DataConfig, build_corpus
    from decentrain.models.factory import build_tokenizer

    cfg = TrainConfig(model=TINY, data=DataConfig(domains=["licenses"], seq_len=32, max_bytes_per_domain=20_000),
                      train=LoopConfig(steps=2, global_batch_size=4, micro_batch_size=2, eval_batches=2, **train))
    tok = build_tokenizer(cfg.model)
    world = World()
    return Trainer(cfg, world, DDP(cfg.algorithm, world), build_model(cfg.model, tok), build_corpus(cfg.data, tok), tmp_path)


def test_compiled_blocks_compile_at_most_two_graphs(tmp_path):
    """A DynamicCache per forward makes every block guard on its own cache layer: one graph per
    layer, then the recompile limit. The loop and evaluation pass use_cache=False: train + eval."""
    from decentrain.algorithms.common.trainer import evaluate

    trainer = _trainer(tmp_path)  # compile=none: the blocks get a counting backend below
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # run the traced graph eagerly: no inductor, fast on CPU

    torch._dynamo.reset()
    try:
        for block in transformer_blocks(trainer.model):
            block.compile(backend=counting_backend)
        for _ in range(2):
            trainer.train_step(trainer.model)
        evaluate(trainer.model, trainer.val_blocks, 2, torch.device("cpu"))
        assert len(graphs) <= 2, f"{len(graphs)} graphs for {len(transformer_blocks(trainer.model))} blocks"
    finally:
        torch._dynamo.reset()
