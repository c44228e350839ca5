"""HDEE routed merge end to end: `python -m recipes.hdee_merge` on a saved ensemble, then load it back."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hdee_helpers import save_random_experts, tiny_cfg

from decentrain.algorithms.hdee.config import save_config
from decentrain.algorithms.hdee.train import model_dir
from decentrain.core.ensemble import token_logprobs
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _ensemble(tmp_path: Path) -> Path:
    cfg = tiny_cfg(tmp_path / "ens", widths=(64, 64))  # two experts of one seed: licenses, arithmetic
    tok = build_tokenizer(cfg.model)
    save_random_experts(cfg, tok)
    torch.manual_seed(7)
    save_model(build_model(cfg.model, tok), tok, model_dir(cfg.ensemble_dir, "seed-64"))
    save_config(cfg.ensemble_dir, dataclasses.asdict(cfg))
    return Path(cfg.ensemble_dir)


def test_merge_recipe_saves_a_routed_model_that_loads_like_any_decentrain_model(tmp_path):
    ens = _ensemble(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "recipes.hdee_merge", f"ensemble_dir={ens}", "calibration_blocks=4"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = ens / "routed"
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    scored = json.loads((out / "score_test.json").read_text())
    assert set(scored) == {"licenses", "arithmetic"}
    for row in scored.values():
        assert 1.0 <= row["experts_run_per_sequence"] <= 2.0
        assert set(row) == {"routed", "experts_run_per_sequence", "lane0-it0-w64", "lane1-it0-w64"}

    from decentrain.algorithms.hdee.routed import RoutedExpertsForCausalLM

    model = build_model(ModelConfig(pretrained=str(out)))  # the library's ordinary loader
    assert isinstance(model, RoutedExpertsForCausalLM) and model.config.expert_names == ["lane0-it0-w64", "lane1-it0-w64"]
    x = torch.randint(3, 200, (2, 16))
    with torch.no_grad():
        assert torch.isfinite(token_logprobs(model, x)).all()


def test_merge_recipe_refuses_bad_config_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "recipes.hdee_merge", "calibration_split=test", f"ensemble_dir={tmp_path}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "config error: calibration_split='test' must be 'train' or 'val'" in proc.stderr
