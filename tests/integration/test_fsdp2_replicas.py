"""FSDP2 inside replicas: 2 replicas x 2 fully_shard ranks on 4 CPU (gloo) ranks, with DCP resume.

A preempted run (train.stop_at) plus its resume gives the uninterrupted run's losses and
final weights bit for bit; the outer algorithm syncs the shards of the two replicas.
"""

from pathlib import Path

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]  # above run_ranks' 600 s


def _runs(world, algo, root):
    from safetensors.torch import load_file

    from decentrain.algorithms.pretraining.run import run_pretraining
    from decentrain.config import config_from_dict
    from decentrain.core.metrics import read_jsonl

    def cfg(stop_at=None):
        return config_from_dict(
            {
                "algorithm": {"name": algo, "inner_steps": 2, **({"full_duplex": False} if algo == "noloco" else {})},
                "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
                "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
                "train": {
                    "steps": 6,
                    "global_batch_size": 8,
                    "micro_batch_size": 1,
                    "eval_every": 3,
                    "eval_batches": 1,
                    "checkpoint_every": 100,
                    "keep_checkpoints": 1,
                    "threads": 1,
                    "stop_at": stop_at,
                },
                "engine": {"name": "fsdp2", "shards_per_replica": 2},
                "optim": {"warmup_steps": 1},
                "logger": {"progress": False, "log_every": 1},
                "launcher": {"name": "torchrun", "nproc_per_node": None},
            }
        )

    straight, preempted = Path(root) / "straight", Path(root) / "preempted"
    a = run_pretraining(cfg(), world, straight)
    run_pretraining(cfg(stop_at=3), world, preempted)  # mid-round: DCP holds model + AdamW shards
    b = run_pretraining(cfg(), world, preempted)
    if world.rank:
        return None
    losses = [
        {r["step"]: r["train/loss"] for r in read_jsonl(d / "metrics.jsonl") if "train/loss" in r}
        for d in (straight, preempted)
    ]
    weights = [load_file(d / "model" / "model.safetensors") for d in (straight, preempted)]
    same = all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    dcp_steps = sorted(p.name for p in (preempted / "checkpoints" / "dcp").iterdir())
    replicas = sorted(p.name for p in (preempted / "checkpoints" / "dcp" / dcp_steps[-1]).iterdir())
    return losses, same, a.eval_loss == b.eval_loss, dcp_steps, replicas


@pytest.mark.parametrize("algo", ["diloco"])
def test_fsdp2_replicas_train_and_resume_exactly(tmp_path, algo):
    losses, same_weights, same_eval, dcp_steps, replicas = run_ranks(_runs, 4, algo, str(tmp_path), timeout=600)[0]
    straight, resumed = losses
    assert sorted(resumed) == list(range(1, 7))
    assert resumed == straight
    assert straight[6] < straight[1]
    assert same_weights and same_eval
    assert dcp_steps == ["step_00000006"] and replicas == ["replica_0", "replica_1"]  # keep=1 pruned step 3
