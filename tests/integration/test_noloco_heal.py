"""SIGKILL one of 4 NoLoCo workers: the launcher starts a replacement, which heals from a live
peer (same φ, bit for bit) and finishes with the others. At the old main the rank stayed dead."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from recipe_helpers import ROOT, TINY, metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(900)  # the replacement is a fresh Python + torch start while 3 workers train

def test_a_killed_noloco_worker_is_replaced_and_heals_from_a_live_peer(tmp_path):
    steps = 1200
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "recipes.train", *TINY, f"run_dir={tmp_path}", "algorithm=noloco",
                             "algorithm.inner_steps=8", "algorithm.deadline_s=3", f"train.steps={steps}",
                             "train.eval_every=1000", "train.checkpoint_every=1000", "launcher.nproc_per_node=4",
                             "launcher.max_restarts=1", "logger.all_ranks=true"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # own process group: cleanup reaches the workers too
    try:
        deadline = time.time() + 240
        while time.time() < deadline:  # kill rank 2 once rank 0 has logged a few steps
            rows = metrics(tmp_path) if (tmp_path / "metrics.jsonl").exists() else []
            if any(r.get("step", 0) >= 4 for r in rows) and (tmp_path / "workers.json").exists():
                break
            time.sleep(0.2)
        pid = json.loads((tmp_path / "workers.json").read_text())["2"]
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=500)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-4000:]
    assert "replaced: rank 2 x1" in out and "workers finished" not in out, out[-4000:]  # all 4 finished
    healed = re.search(r"\[rank 2\] healed from rank (\d) in ([\d.]+)s: round (\d+), phi crc ([0-9a-f]{8})", out)
    assert healed, out[-4000:]
    donor, round_, crc = healed.group(1), healed.group(3), healed.group(4)
    # the replacement's φ is bit for bit the donor's at the snapshot
    assert re.search(rf"\[rank {donor}\] serving heal to rank 2 \(incarnation 1\): step \d+, round {round_}, phi crc {crc}", out), out[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "metrics.rank2.jsonl").read_text().splitlines()]
    heal = [r for r in rows if "heal/seconds" in r]
    assert len(heal) == 1 and heal[0]["heal/from_rank"] == int(donor)
    assert max(r["step"] for r in rows) >= steps - 8 * 3  # the replacement finished the run (a late rank may jump)
    first_after = heal[0]["step"]
    assert first_after > 8 * int(round_) - 1  # it continued from the donor's step, not from 0
    after = [r for r in rows if r["step"] > first_after and "outer/partner_missed" in r]
    assert any(r["outer/partner_missed"] == 0 for r in after[:3]), after[:3]  # back in the pairing within 3 rounds
    for rank in (0, 1, 3):
        name = "metrics.jsonl" if rank == 0 else f"metrics.rank{rank}.jsonl"
        survivor = [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
        assert max(r["step"] for r in survivor) >= steps - 8 * 3
