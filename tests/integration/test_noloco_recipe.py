"""`decentrain algorithm=noloco` end to end on 2 local gloo ranks, and its refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

TINY = [
    "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
    "data.seq_len=32", "data.max_bytes_per_domain=20000", "data.domains=[python_docs,licenses]",
    "train.global_batch_size=8", "train.micro_batch_size=2", "train.eval_batches=1", "logger.log_every=1",
    "logger.progress=false", "train.threads=1",
]


def recipe(run_dir: Path, *overrides: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "recipes.train", *TINY, f"run_dir={run_dir}", *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_noloco_recipe_trains_and_syncs_with_partners(tmp_path):
    proc = recipe(tmp_path, "algorithm=noloco", "algorithm.inner_steps=2", "train.steps=6", "train.eval_every=6",
                  "algorithm.deadline_s=60")
    assert "noloco" in proc.stdout and "world 2" in proc.stdout
    rows = metrics(tmp_path)
    rounds = [r["outer/round"] for r in rows if "outer/round" in r]
    assert rounds == [1.0, 2.0, 3.0]
    assert not any(r.get("outer/partner_missed") for r in rows)
    assert (tmp_path / "model/model.safetensors").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints/step_00000006").iterdir()) == ["rank_0", "rank_1"]


@pytest.mark.parametrize("override,field", [
    ("algorithm.inner_steps=0", "algorithm.inner_steps=0"),
    ("launcher.nproc_per_node=3", "algorithm.odd_world"),
])
def test_bad_input_fails_before_training_naming_the_field(tmp_path, override, field):
    proc = recipe(tmp_path, "algorithm=noloco", "train.global_batch_size=6", override, ok=False)
    out = proc.stdout + proc.stderr
    assert field in out
    assert not (tmp_path / "metrics.jsonl").exists()
