"""NoLoCo through launch/slurm.sbatch on the local Slurm test cluster, with a node's step killed.

Opt-in: DECENTRAIN_SLURM_TESTS=1, root, slurm-wlm + munge (tests/slurm_helpers.py). Two nodes x 2
ranks, `sbatch --no-kill`: once a round key is in the job store (on the batch host, port
50000 + job id % 15000), every process of node 1's step (its launcher and workers) is SIGKILLed;
node 0's workers go on. Then node 1's ranks are started again inside the allocation with
`srun --overlap` and the saved `hosts.env`, as docs/multihost.md says: they heal from node 0's
ranks and the job completes. At the old main NoLoCo ran under torchrun elastic here and the kill
restarted every rank from the last checkpoint.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from decentrain.core.metrics import metrics_file
from decentrain.testing import ROOT, LocalSlurm, metrics, missing_requirements

why_not = None if os.environ.get("DECENTRAIN_SLURM_TESTS") == "1" else "opt-in: set DECENTRAIN_SLURM_TESTS=1"
why_not = why_not or missing_requirements()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(why_not is not None, reason=why_not or "")]

ARGS = [
    "experiment=noloco_cpu",
    "train.steps=400",
    "algorithm.inner_steps=4",
    "algorithm.deadline_s=5",
    "logger.all_ranks=true",
    "train.eval_every=1000",
    "train.checkpoint_every=1000",
]
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def step_pids(job: int, node: int) -> list[int]:
    """Every process of `job`'s step on `node` (launcher and workers inherit SLURM_NODEID)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"SLURM_JOB_ID={job}".encode() in env and f"SLURM_NODEID={node}".encode() in env and b"recipes.train" in cmd:
            out.append(int(proc.name))
    return out


@pytest.mark.timeout(2400)
def test_a_killed_nodes_step_costs_a_round_and_its_ranks_heal_when_started_again(tmp_path):
    from torch.distributed import TCPStore

    cluster = LocalSlurm(tmp_path / "cluster")
    cluster.start()
    env = {**cluster.env, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "NPROC": "2"}
    try:
        sub = subprocess.run(
            ["sbatch", "--no-kill", "--nodes", "2", str(ROOT / "launch/slurm.sbatch"), *ARGS],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        job = int(re.search(r"Submitted batch job (\d+)", sub.stdout).group(1))
        run = tmp_path / f"runs/slurm-{job}"
        while not (run / "hosts.env").exists():
            time.sleep(0.5)
        store = TCPStore("127.0.0.1", 50000 + job % 15000, is_master=False, timeout=timedelta(seconds=600))
        store.wait(["decentrain/attempt0/shared/job1/progress/0"])  # a round key: the job trains
        while not step_pids(job, 1):
            time.sleep(0.5)
        while pids := step_pids(job, 1):
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        cmd = f"source {run}/hosts.env; NODE_RANK=1 launch/multinode.sh {' '.join(ARGS)}"
        rejoin = subprocess.run(
            ["srun", "--jobid", str(job), "--overlap", "-N1", "-n1", "-w", cluster.nodes[1], "bash", "-c", cmd],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert rejoin.returncode == 0, rejoin.stdout[-3000:] + rejoin.stderr[-3000:]
        assert "replaced: rank 2 x1, rank 3 x1" in rejoin.stdout + rejoin.stderr
        while (
            state := subprocess.run(
                ["scontrol", "-o", "show", "job", str(job)], env=env, capture_output=True, text=True
            ).stdout
        ) and not any(f"JobState={s}" in state for s in DONE):
            time.sleep(2)
        for rank in (0, 1):  # node 0's ranks finished the run
            rows = metrics(run, metrics_file(rank))
            assert max(r.get("outer/round", 0) for r in rows) >= 400 // 4 - 3
        for rank in (2, 3):  # node 1's ranks healed and trained to the end
            rows = metrics(run, metrics_file(rank))
            assert any("heal/seconds" in r for r in rows) and max(r.get("outer/round", 0) for r in rows) >= 400 // 4 - 3
    finally:
        cluster.stop()
