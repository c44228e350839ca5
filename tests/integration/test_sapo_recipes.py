"""The SAPO recipes end to end on tiny models: SFT warm start, a silo node, a collective swarm."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.hidden_size=32", "model.num_layers=2", "model.intermediate_size=64", "model.num_heads=4",
        "sampling.max_new_tokens=4", "loss.num_generations=4", "train.micro_batch_size=16", "train.threads=1",
        "task.size=100", "logger.progress=false"]


def _run(module, args, timeout=120):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_sft_then_silo_node_loads_the_warm_start(tmp_path):
    sft_args = [a for a in TINY if not a.startswith(("loss.", "train."))]
    _run("recipes.sft", [*sft_args, "sft.steps=3", "sft.batch_size=4", "eval.prompts_per_task=2",
                         "eval.num_generations=2", f"run_dir={tmp_path / 'sft'}"])
    model_dir = tmp_path / "sft" / "model"
    assert (model_dir / "model.safetensors").exists()
    out = _run("recipes.rl", [*TINY, "sapo=silo", "train.rounds=2", f"model.pretrained={model_dir}",
                              f"model.tokenizer={model_dir}", f"run_dir={tmp_path / 'rl'}"])
    assert "rounds 2" in out
    rows = [json.loads(line) for line in (tmp_path / "rl" / "node0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["external_groups"] == 0


def test_bad_config_fails_before_start(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "recipes.rl", "sapo=silo", "batch.num_external=2", f"run_dir={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "batch.num_external=2" in proc.stderr + proc.stdout
    assert not (tmp_path / "node0").exists()


def test_collective_swarm_with_local_ranks(tmp_path):
    # Outside torchrun, the recipe starts num_nodes ranks itself; node 1 is a different model size.
    _run("recipes.rl", [*TINY, "sapo=swarm_2_6", "num_nodes=2", "train.rounds=2", "batch.num_local=2",
                        "batch.num_external=2", "+nodes=[{},{model:{hidden_size:48}}]", f"run_dir={tmp_path}"], timeout=180)
    for node in ("node0", "node1"):
        rows = [json.loads(line) for line in (tmp_path / node / "metrics.jsonl").read_text().splitlines()]
        assert [r["external_received"] for r in rows] == [2, 2]
    n1 = json.loads((tmp_path / "node1" / "node_config.json").read_text())
    assert n1["model"]["hidden_size"] == 48
