"""An HDEE expert lane trained by a NoLoCo pair: the full algorithm section set from the HDEE
config, run through the one pre-training job path, under the survivor launcher."""

import json

import pytest
import yaml

from decentrain.testing import run_recipe

# ~2.5 min on 2 busy cores: three processes start
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def run(*args: str):
    return run_recipe("recipes.hdee_train", *args, timeout=300)


def test_an_expert_lane_trains_as_a_noloco_pair(tmp_path):
    ens = tmp_path / "ens"
    common = ["hdee_plan=smoke", f"ensemble_dir={ens}", "train.micro_batch_size=2", "train.device=cpu"]
    run(*common, "job.stage=seed", "job.index=0")  # the seed: one process, the default (ddp) section
    # lane 0 has two iterations: two gossip runs back to back in one process group, each branching from the last
    run(
        *common,
        "job.stage=lane",
        "job.index=0",
        "launcher.nproc_per_node=2",
        "algorithm@job.algorithm=noloco",
        "job.algorithm.inner_steps=1",
        "job.algorithm.outer_optimizer.lr=0.5",
        "job.algorithm.deadline_s=60",
    )

    assert (ens / "lane0-it0-M" / "model" / "model.safetensors").exists()
    run_dir = ens / "lane0-it1-M"
    assert (run_dir / "model" / "model.safetensors").exists()
    assert set(json.loads((ens / "jobs" / "lane0" / "workers.json").read_text())) == {"0", "1"}  # survivor launcher
    algorithm = yaml.safe_load((run_dir / "config.yaml").read_text())["algorithm"]
    assert algorithm["name"] == "noloco" and algorithm["inner_steps"] == 1 and algorithm["deadline_s"] == 60
    assert algorithm["outer_optimizer"] == {"name": "noloco", "lr": 0.5, "momentum": 0.5}  # the rule's own fields only
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "outer/round" in r][-1]
    # 3 steps, H = 1: three exchanges with the partner
    assert last["outer/round"] == 3 and last["outer/partner_missed"] == 0
