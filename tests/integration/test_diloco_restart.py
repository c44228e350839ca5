"""`launcher.max_restarts` recovers a collective (DiLoCo) job: a worker SIGKILLed mid-run is restarted with
the whole group, which resumes from the last checkpoint and logs exactly the no-fault run's losses.
At the old main every restart failed at gloo's connectFullMesh ("Connection refused")."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from recipe_helpers import ROOT, TINY, recipe, train_losses

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

ARGS = ["algorithm=diloco", "algorithm.inner_steps=4", "train.steps=16", "train.eval_every=100", "train.checkpoint_every=4"]


def _pid_of_rank(token: str, rank: int) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FT_TEST={token}".encode() in env and f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"\0".join(env):
            return int(pid)
    return None


def test_max_restarts_resumes_a_killed_diloco_job_exactly(tmp_path):
    straight = tmp_path / "straight"
    recipe(straight, *ARGS)
    run_dir = tmp_path / "killed"
    token = uuid.uuid4().hex
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "FT_TEST": token}
    proc = subprocess.Popen([sys.executable, "-m", "recipes.train", *TINY, *ARGS, f"run_dir={run_dir}", "launcher.max_restarts=1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not (run_dir / "checkpoints" / "step_00000004").exists():
            time.sleep(0.2)
        pid = _pid_of_rank(token, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "resumed from step" in out
    assert train_losses(run_dir) == train_losses(straight)  # bit-identical, each step logged once
