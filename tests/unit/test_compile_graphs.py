"""`train.compile=blocks` must not recompile per step: the loop's forwards build no KV cache."""

from __future__ import annotations

import torch

from decentrain.algorithms.pretraining.precision import transformer_blocks
from decentrain.testing import tiny_trainer


def test_compiled_blocks_compile_at_most_two_graphs(tmp_path):
    """A DynamicCache per forward makes every block guard on its own cache layer: one graph per
    layer, then the recompile limit. The loop and evaluation pass use_cache=False: train + eval."""
    from decentrain.algorithms.pretraining.trainer import evaluate

    trainer = tiny_trainer(tmp_path)  # compile=none: the blocks get a counting backend below
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
