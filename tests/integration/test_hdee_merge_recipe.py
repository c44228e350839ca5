"""HDEE routed merge end to end: `python -m recipes.hdee_merge` on a saved ensemble, then load it back."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from decentrain.algorithms.hdee.config import save_config
from decentrain.algorithms.hdee.train import model_dir
from decentrain.core.comm.ensemble import token_logprobs
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model
from decentrain.testing import run_recipe, save_random_experts, tiny_hdee_config

pytestmark = pytest.mark.integration


def _ensemble(tmp_path: Path) -> Path:
    cfg = tiny_hdee_config(tmp_path / "ens", widths=(64, 64))  # two experts of one seed: licenses, arithmetic
    tok = build_tokenizer(cfg.model)
    save_random_experts(cfg, tok)
    torch.manual_seed(7)
    save_model(build_model(cfg.model, tok), tok, model_dir(cfg.ensemble_dir, "seed-64"))
    save_config(cfg.ensemble_dir, dataclasses.asdict(cfg))
    return Path(cfg.ensemble_dir)


def test_merge_recipe_saves_a_routed_model_that_loads_like_any_decentrain_model(tmp_path):
    ens = _ensemble(tmp_path)
    run_recipe("recipes.hdee_merge", f"ensemble_dir={ens}", "calibration_blocks=4")
    out = ens / "routed"
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    scored = json.loads((out / "score_test.json").read_text())
    assert set(scored) == {"licenses", "arithmetic"}
    for row in scored.values():
        assert 1.0 <= row["experts_run_per_sequence"] <= 2.0
        assert set(row) == {"routed", "experts_run_per_sequence", "lane0-it0-w64", "lane1-it0-w64"}

    from decentrain.algorithms.hdee.routed import RoutedExpertsForCausalLM

    model = build_model(ModelConfig(pretrained=str(out)))  # the library's ordinary loader
    assert isinstance(model, RoutedExpertsForCausalLM) and model.config.expert_names == [
        "lane0-it0-w64",
        "lane1-it0-w64",
    ]
    x = torch.randint(3, 200, (2, 16))
    with torch.no_grad():
        assert torch.isfinite(token_logprobs(model, x)).all()


def test_merge_recipe_refuses_bad_config_in_one_line(tmp_path):
    proc = run_recipe("recipes.hdee_merge", "calibration_split=test", f"ensemble_dir={tmp_path}", ok=False, timeout=120)
    assert "config error: calibration_split='test' must be 'train' or 'val'" in proc.stderr


# -- issue 40 item 4: the recipe refuses what it cannot merge in one line, before any weights where it can --


def _one_line_refusal(proc, prefix: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and lines and lines[-1].startswith(prefix), proc.stderr[-3000:]
    return lines[-1]


def test_merge_recipe_names_a_missing_backbone_in_one_line(tmp_path):
    proc = run_recipe(
        "recipes.hdee_merge",
        f"backbone={tmp_path}/no_such_seed",
        f"out_dir={tmp_path}/out",
        f"experts=[{{name: a, path: {tmp_path}, domains: [licenses]}}]",
        ok=False,
        timeout=120,
    )
    line = _one_line_refusal(proc, "config error: backbone=")
    assert line.endswith(f"{tmp_path}/no_such_seed: no such directory ({tmp_path} exists)")


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "router_layer=999",
            "config error: router_layer=999 names no hidden state of the backbone (1 layers: allowed -2 to 1)",
        ),
        ("ridge_lambda=nan", "config error: ridge_lambda=nan must be a finite number in (0, inf)"),
        ("batch_size=0", "config error: batch_size=0 must be >= 1"),
    ],
)
def test_merge_recipe_refuses_bad_values_before_loading(tmp_path, override, message):
    ens = _ensemble(tmp_path)
    proc = run_recipe("recipes.hdee_merge", f"ensemble_dir={ens}", override, ok=False, timeout=120)
    assert _one_line_refusal(proc, "config error: ") == message
    assert not (ens / "routed").exists()


def test_merge_recipe_refuses_an_expert_missing_tensors_and_saves_nothing(tmp_path):
    from safetensors.torch import load_file, save_file

    ens = _ensemble(tmp_path)
    weights = model_dir(ens, "lane1-it0-w64") / "model.safetensors"
    tensors = load_file(weights)
    save_file({k: v for i, (k, v) in enumerate(sorted(tensors.items())) if i % 2}, weights, metadata={"format": "pt"})
    proc = run_recipe("recipes.hdee_merge", f"ensemble_dir={ens}", "calibration_blocks=4", ok=False, timeout=180)
    line = _one_line_refusal(
        proc, "checkpoint refused: experts[1] (lane1-it0-w64): 6 tensor(s) missing: lm_head.weight, "
    )
    assert line.endswith(" and 2 more") and not (ens / "routed").exists()


def test_merge_recipe_refusals_hold_as_an_ordinary_user():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "missing_backbone or missing_tensors")
