"""HDEE training: seeds at their own width, lanes continue their previous checkpoint, unique dirs."""

import json

import pytest
import torch
from safetensors.torch import load_file

from decentrain.algorithms.hdee.plan import LaneConfig
from decentrain.algorithms.hdee.train import model_dir, run_stage, train_expert, train_seed
from decentrain.core.world import World
from decentrain.testing import tiny_hdee_config


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_seeds_then_lanes_branch_and_continue_without_overwriting(tmp_path):
    cfg = tiny_hdee_config(tmp_path, widths=(48, 80))
    cfg.plan.lanes[1] = LaneConfig(
        domains=["arithmetic", "licenses"], steps=[2, 1], size="w80", intermediate_size=80, seed="seed-80"
    )
    cfg.job.stage = "seeds"
    run_stage(cfg, World())
    for seed, width in (("seed-48", 48), ("seed-80", 80)):
        assert json.loads((model_dir(tmp_path, seed) / "config.json").read_text())["intermediate_size"] == width
    cfg.job.stage, cfg.job.index = "lane", 1
    [final] = run_stage(cfg, World())
    assert final == model_dir(tmp_path, "lane1-it1-w80")
    names = sorted(p.name for p in tmp_path.iterdir() if (p / "model").exists())
    assert names == ["lane1-it0-w80", "lane1-it1-w80", "seed-48", "seed-80"]  # lane 0 is another job
    seed, it0, it1 = (_weights(model_dir(tmp_path, n)) for n in ("seed-80", "lane1-it0-w80", "lane1-it1-w80"))
    key = "model.layers.0.mlp.up_proj.weight"
    assert it1[key].shape == (80, 32)
    assert not torch.equal(seed[key], it0[key]) and not torch.equal(it0[key], it1[key])
    # every run trained only its own domain, each for its own step count
    logs = [json.loads(x) for x in (tmp_path / "lane1-it0-w80" / "metrics.jsonl").read_text().splitlines()]
    assert {k for r in logs for k in r if k.startswith("eval/")} == {
        "eval/loss",
        "eval/arithmetic",
        "eval/bpb",
        "eval/bpb/arithmetic",
    }
    assert max(r["step"] for r in logs) == 2


def test_a_finished_run_is_skipped_and_a_missing_parent_is_named(tmp_path):
    cfg = tiny_hdee_config(tmp_path, widths=(64,))
    run = cfg.plan.expert_runs()[0]
    with pytest.raises(
        FileNotFoundError, match=r"expert lane0-it0-w64 \(lanes\[0\] iteration 0\) starts from 'seed-64'"
    ):
        train_expert(cfg, World(), run)
    out = train_seed(cfg, World(), cfg.plan.seeds[0])
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert train_seed(cfg, World(), cfg.plan.seeds[0]) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
