"""launcher=hosts on one machine: two host launchers and a job store, as launch/multinode.sh runs them.

The recipe picks the path by the algorithm: NoLoCo runs as survivors (clients of the job store),
DDP under torch elastic with the job store as its c10d rendezvous (multinode.sh's default RDZV).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from decentrain.testing import ROOT, TINY, metrics, start_store

pytestmark = pytest.mark.integration


@pytest.mark.timeout(600)
@pytest.mark.parametrize("algorithm", ["ddp", "noloco"])
def test_two_host_launchers_run_a_job_through_the_job_store(tmp_path, algorithm):
    store, addr = start_store(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "DECENTRAIN_JOB_SECRET": os.urandom(16).hex()}
    run = tmp_path / "run"
    args = [
        *TINY,
        f"run_dir={run}",
        f"algorithm={algorithm}",
        "train.steps=8",
        "train.eval_every=100",
        "train.checkpoint_every=100",
        "launcher=hosts",
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        f"launcher.store={addr}",
        f"launcher.rdzv_endpoint={addr}",
        f"launcher.job_id=j{algorithm}",
    ]
    if algorithm == "noloco":
        args.append("algorithm.inner_steps=2")
    try:
        hosts = [
            subprocess.Popen(
                [sys.executable, "-m", "recipes.train", *args, f"launcher.node_rank={k}"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for k in (0, 1)
        ]
        outs = [h.communicate(timeout=500)[0] for h in hosts]
    finally:
        store.kill()
        for h in hosts:
            h.kill()
    for h, out in zip(hosts, outs):
        assert h.returncode == 0, out[-3000:]
    assert max(r["step"] for r in metrics(run) if "train/loss" in r) == 8
    survivors = (run / "workers.node1.json").exists()  # the survivor launcher lists its workers per host
    assert survivors == (algorithm == "noloco")
