"""FSDP2's save is collective over a replica's shard ranks: a NaN in one rank's shard must stop
every rank of the replica, not just the one that holds it (the other would hang inside DCP's save)."""

from pathlib import Path

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def _save_with_nan_on_rank1(world, root):
    from decentrain.algorithms.base import ALGORITHMS
    from decentrain.algorithms.pretraining.trainer import Trainer
    from decentrain.config import config_from_dict
    from decentrain.core.mesh import replica_layout
    from decentrain.data.blocks import build_corpus
    from decentrain.models.factory import build_model, build_tokenizer

    cfg = config_from_dict(
        {
            "algorithm": {"name": "diloco", "inner_steps": 2},
            "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
            "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 1, "eval_batches": 1, "threads": 1},
            "engine": {"name": "fsdp2", "shards_per_replica": 2},
            "logger": {"progress": False},
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )
    tok = build_tokenizer(cfg.model)
    torch.manual_seed(0)
    layout = replica_layout(world, 2)
    trainer = Trainer(
        cfg.train,
        world,
        ALGORITHMS.get("diloco")(cfg.algorithm, layout.outer),
        build_model(cfg.model, tok),
        build_corpus(cfg.data, tok),
        Path(root),
        layout=layout,
        engine=cfg.engine,
        optim=cfg.optim,
        logger=cfg.logger,
    )
    if world.rank == 1:
        _, shard = next(iter(trainer.engine.outer_model.named_parameters()))
        shard.data[0] = float("nan")  # rank 1's local shard only; rank 0's shards stay finite
    try:
        trainer.save()
    except FloatingPointError as e:
        return str(e)
    return "saved"


def test_a_nan_in_one_shard_stops_every_rank_of_the_replica(tmp_path):
    # on the old, local check rank 0 entered the collective DCP save alone and hung (this timeout fails it)
    out = run_ranks(_save_with_nan_on_rank1, 2, str(tmp_path))
    assert "another rank of this replica" in out[0]
    assert "non-finite weights in" in out[1]
    assert not list((tmp_path / "checkpoints").glob("step_*"))
