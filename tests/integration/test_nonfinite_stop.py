"""A run whose loss turns NaN stops with a clear error and keeps its last good checkpoint (no NaN model saved)."""

import pytest
import torch

from decentrain.algorithms.pretraining.run import run_pretraining
from decentrain.algorithms.pretraining.trainer import Trainer
from decentrain.config import config_from_dict
from decentrain.core.checkpoint import Checkpointer
from decentrain.core.world import World

pytestmark = pytest.mark.integration


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    cfg = config_from_dict(
        {
            "algorithm": {"name": "ddp"},
            "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
            "train": {
                "steps": 8,
                "global_batch_size": 2,
                "micro_batch_size": 1,
                "eval_every": 100,
                "eval_batches": 1,
                "checkpoint_every": 2,
                "threads": 1,
            },
            "logger": {"progress": False, "log_every": 1},
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )
    real = Trainer.train_step

    def poisoned(self, model):
        if self.step == 5:  # a bad batch, an overflow: the weights go NaN during step 6
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return real(self, model)

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    with pytest.raises(FloatingPointError, match="step 6: train loss is nan.*last good checkpoint is kept"):
        run_pretraining(cfg, World(), tmp_path)
    ck = Checkpointer(tmp_path / "checkpoints", 0, 1)
    assert ck.agree_resume_step(World()) == 4
    assert all(torch.isfinite(v).all() for v in ck.load(4)["model"].values())
    assert not (tmp_path / "model").exists()
