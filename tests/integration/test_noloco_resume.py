"""Exact resume of all outer state: a preempted run (train.stop_at) plus its resume
gives the uninterrupted run's loss curve and final weights, bit for bit."""

from pathlib import Path

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = pytest.mark.integration

ALGO = {
    "noloco": {"name": "noloco", "inner_steps": 2},
    "streaming_diloco": {
        "name": "streaming_diloco",
        "inner_steps": 4,
        "num_fragments": 2,
        "overlap_steps": 2,
        "quantization": "fp16",
    },
    "diloco": {"name": "diloco", "inner_steps": 2},
    # another outer optimizer's state (Adam's two moments and step count) resumes bit for bit too
    "diloco_adam": {"name": "diloco", "inner_steps": 2, "outer_optimizer": {"name": "adam", "lr": 0.01}},
}


def _three_runs(world, algo, root):
    from decentrain.algorithms.pretraining.run import run_pretraining
    from decentrain.config import config_from_dict
    from decentrain.core.metrics import read_jsonl

    def cfg(stop_at=None):
        return config_from_dict(
            {
                "algorithm": ALGO[algo],
                "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
                "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
                "train": {
                    "steps": 8,
                    "global_batch_size": 4,
                    "micro_batch_size": 1,
                    "eval_every": 4,
                    "eval_batches": 1,
                    "checkpoint_every": 100,
                    "threads": 1,
                    "stop_at": stop_at,
                },
                "logger": {"progress": False, "log_every": 1},
                "launcher": {"name": "torchrun", "nproc_per_node": None},
            }
        )

    straight, preempted = Path(root) / "straight", Path(root) / "preempted"
    a = run_pretraining(cfg(), world, straight)
    run_pretraining(cfg(stop_at=3), world, preempted)  # stops mid-round (and mid-flight for streaming)
    # the resume follows at once in the same processes: its agreement meets the other rank before
    # it lists the checkpoints, so a rank still saving step 3 is waited for (issue 44)
    b = run_pretraining(cfg(), world, preempted)
    if world.rank:
        return None
    losses = [
        {r["step"]: r["train/loss"] for r in read_jsonl(d / "metrics.jsonl") if "train/loss" in r}
        for d in (straight, preempted)
    ]
    from safetensors.torch import load_file

    weights = [load_file(d / "model" / "model.safetensors") for d in (straight, preempted)]
    same = all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    steps = [r["step"] for r in read_jsonl(preempted / "metrics.jsonl") if "train/loss" in r]
    return losses, same, a.eval_loss == b.eval_loss, steps


@pytest.mark.parametrize("algo", list(ALGO))
def test_preempted_run_resumes_exactly(tmp_path, algo):
    losses, same_weights, same_eval, logged_steps = run_ranks(_three_runs, 2, algo, str(tmp_path))[0]
    straight, resumed = losses
    assert logged_steps == list(range(1, 9))  # the resumed steps are logged once, not twice
    assert sorted(resumed) == list(range(1, 9))
    assert resumed == straight
    assert same_weights and same_eval
