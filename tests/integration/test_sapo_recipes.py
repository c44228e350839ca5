"""The SAPO recipes end to end on tiny models: SFT warm start, a silo node, a collective swarm."""

import json

import pytest

from decentrain.testing import TINY_RL, run_recipe

pytestmark = pytest.mark.integration


def test_sft_then_silo_node_loads_the_warm_start(tmp_path):
    sft_args = [a for a in TINY_RL if not a.startswith(("loss.", "train."))]
    run_recipe(
        "recipes.sft",
        *sft_args,
        "sft.steps=3",
        "sft.batch_size=4",
        "eval.prompts_per_task=2",
        "eval.num_generations=2",
        f"run_dir={tmp_path / 'sft'}",
        timeout=120,
    )
    model_dir = tmp_path / "sft" / "model"
    assert (model_dir / "model.safetensors").exists()
    out = run_recipe(
        "recipes.rl",
        *TINY_RL,
        "sapo=silo",
        "train.rounds=2",
        f"model.pretrained={model_dir}",
        f"model.tokenizer={model_dir}",
        f"run_dir={tmp_path / 'rl'}",
        timeout=120,
    ).stdout
    assert "rounds 2" in out
    rows = [json.loads(line) for line in (tmp_path / "rl" / "node0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["external_groups"] == 0


def test_bad_config_fails_before_start(tmp_path):
    proc = run_recipe("recipes.rl", "sapo=silo", "batch.num_external=2", f"run_dir={tmp_path}", ok=False, timeout=120)
    assert "batch.num_external=2" in proc.stderr + proc.stdout
    assert not (tmp_path / "node0").exists()


def test_collective_swarm_with_local_ranks(tmp_path):
    # Outside torchrun, the recipe starts num_nodes ranks itself; node 1 is a different model size.
    run_recipe(
        "recipes.rl",
        *TINY_RL,
        "sapo=swarm_2_6",
        "num_nodes=2",
        "train.rounds=2",
        "batch.num_local=2",
        "batch.num_external=2",
        "+nodes=[{},{model:{hidden_size:48}}]",
        f"run_dir={tmp_path}",
        timeout=180,
    )
    for node in ("node0", "node1"):
        rows = [json.loads(line) for line in (tmp_path / node / "metrics.jsonl").read_text().splitlines()]
        assert [r["external_received"] for r in rows] == [2, 2]
    n1 = json.loads((tmp_path / "node1" / "node_config.json").read_text())
    assert n1["model"]["hidden_size"] == 48
