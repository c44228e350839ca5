"""NoLoCo across 2 replicas × 2 ZeRO-2 shards (DeepSpeed on CPU over gloo), through the recipe."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from decentrain.algorithms.pretraining.engines.deepspeed import COMM_OP, extension_build_lock
from decentrain.testing import metrics, run_train

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(600),  # above the recipe's own 480 s limit (pyproject's default is 300)
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed"),
]


def plant_stale_build_lock() -> Path:
    """What a rank killed mid-build of DeepSpeed's comm op leaves: torch's lock file, no process
    behind it. Before engines/deepspeed.load_comm_op every later run waited on it forever."""
    op_dir = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / COMM_OP  # the machine's cache, set in conftest
    with extension_build_lock(op_dir.parent):  # no decentrain rank is building while we plant it
        op_dir.mkdir(exist_ok=True)
        (op_dir / "lock").touch()
    return op_dir


def test_noloco_over_zero2_replicas_trains_syncs_and_checkpoints(tmp_path):
    op_dir = plant_stale_build_lock()
    # 4 ranks x micro 2 x accum 2 = 16; H=4 -> outer rounds at steps 4 and 8
    proc = run_train(
        tmp_path,
        "experiment=noloco_zero2_cpu",
        "train.global_batch_size=16",
        "train.steps=8",
        "train.eval_every=8",
        "algorithm.inner_steps=4",
        "algorithm.deadline_s=60",
        "optim.warmup_steps=2",
        timeout=480,
    )  # DeepSpeed probes its op builders with gcc at start-up: minutes on 2 busy cores
    assert "2 replicas x 2 shards, deepspeed" in proc.stdout
    assert any(op_dir.glob("*.so")), "DeepSpeed built its comm op elsewhere: the planted lock tested nothing"
    rows = metrics(tmp_path)
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.1, losses
    assert [r["outer/round"] for r in rows if "outer/round" in r] == [1.0, 2.0]
    assert not any(r.get("outer/partner_missed") for r in rows)

    step = tmp_path / "checkpoints/step_00000008"
    weights = [load_file(step / f"rank_{r}/tensors.safetensors") for r in range(4)]
    model_keys = [k for k in weights[0] if k.startswith("model.")]
    assert model_keys
    # the shard ranks of one replica hold the same weights; with 2 replicas every round
    # pairs them, so after the step-8 outer step (trained on different data) all 4 agree
    for a, b in ((0, 1), (2, 3), (0, 2)):
        assert all(weights[a][k].equal(weights[b][k]) for k in model_keys), (a, b)
    state = json.loads((step / "rank_0/state.json").read_text())
    assert state["state"]["algorithm"]["round"] == 2 and state["state"]["algorithm"]["outer"]
    assert any(k.startswith("algorithm.outer") for k in weights[0])  # outer state tensors saved

    # ZeRO's partitioned optimizer state is checkpointed by DeepSpeed, one directory per replica
    assert sorted(p.name for p in (tmp_path / "checkpoints/deepspeed").iterdir()) == ["replica_0", "replica_1"]
    proc = run_train(
        tmp_path,
        "experiment=noloco_zero2_cpu",
        "train.global_batch_size=16",
        "train.steps=10",
        "train.eval_every=10",
        "algorithm.inner_steps=4",
        "algorithm.deadline_s=60",
        "optim.warmup_steps=2",
        timeout=480,
    )
    assert "resumed from step 8" in proc.stdout
    rows = metrics(tmp_path)
    resumed = [r["train/loss"] for r in rows if "train/loss" in r][8:]
    assert len(resumed) == 2 and all(x is not None and x < losses[0] for x in resumed), resumed
