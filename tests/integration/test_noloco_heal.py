"""SIGKILL one of 4 NoLoCo workers: the launcher starts a replacement, which heals from a live
peer (same φ, bit for bit) and finishes with the others. At the old main the rank stayed dead."""

import json
import re

import pytest

from decentrain.core.metrics import metrics_file
from decentrain.testing import metrics, recipe_killing_a_worker, worker_ready

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # 1-5 min, and a race: the survivors must still be training when a fresh Python + torch replacement asks to heal
    pytest.mark.optin,
]


@pytest.mark.timeout(900)  # the replacement is a fresh Python + torch start while 3 workers train
def test_a_killed_noloco_worker_is_replaced_and_heals_from_a_live_peer(tmp_path):
    steps = 1200

    run = recipe_killing_a_worker(
        tmp_path,
        "algorithm=noloco",
        "algorithm.inner_steps=8",
        "algorithm.deadline_s=3",
        f"train.steps={steps}",
        "train.eval_every=1000",
        "train.checkpoint_every=1000",
        "launcher.nproc_per_node=4",
        "launcher.max_restarts=1",
        "logger.all_ranks=true",
        ready=lambda: worker_ready(tmp_path, 4),
        victim=lambda: json.loads((tmp_path / "workers.json").read_text())["2"],
        wait_s=240,
        timeout=500,
    )
    out = run.stdout
    assert run.returncode == 0, out[-4000:]
    assert "replaced: rank 2 x1" in out and "workers finished" not in out, out[-4000:]  # all 4 finished
    healed = re.search(r"\[rank 2\] healed from rank (\d) in ([\d.]+)s: round (\d+), phi crc ([0-9a-f]{8})", out)
    assert healed, out[-4000:]
    donor, round_, crc = healed.group(1), healed.group(3), healed.group(4)
    # the replacement's φ is bit for bit the donor's at the snapshot
    served = re.search(
        rf"\[rank {donor}\] serving heal to rank 2 \(incarnation 1\): step (\d+), round {round_}, phi crc {crc}", out
    )
    assert served, out[-4000:]
    rows = metrics(tmp_path, "metrics.rank2.jsonl")
    heal = [r for r in rows if "heal/seconds" in r]
    assert len(heal) == 1 and heal[0]["heal/from_rank"] == int(donor)
    rounds = steps // 8
    # the replacement finished the run: its round counter (which a late rank's jump advances too) reached the end
    assert max(r.get("outer/round", 0) for r in rows) >= rounds - 1
    first_after = heal[0]["step"]
    assert first_after >= int(served.group(1))  # it continued from the donor's step (a jumping rank's step < 8 x round)
    after = [r for r in rows if r["step"] > first_after and "outer/partner_missed" in r]
    assert any(r["outer/partner_missed"] == 0 for r in after[:3]), after[:3]  # back in the pairing within 3 rounds
    for rank in (0, 1, 3):
        survivor = metrics(tmp_path, metrics_file(rank))
        assert max(r.get("outer/round", 0) for r in survivor) >= rounds - 1
