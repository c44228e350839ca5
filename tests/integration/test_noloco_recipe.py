"""`decentrain algorithm=noloco` end to end on 2 local gloo ranks, and its refusals."""

import pytest

from decentrain.testing import metrics, run_train

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("overlap", [False, True])
def test_noloco_recipe_trains_and_syncs_with_partners(tmp_path, overlap):
    # overlap: round r's exchange runs on a helper thread during round r+1; the last one drains at step 6
    proc = run_train(
        tmp_path,
        "algorithm=noloco",
        "algorithm.inner_steps=2",
        "train.steps=6",
        "train.eval_every=6",
        "algorithm.deadline_s=60",
        f"algorithm.overlap={str(overlap).lower()}",
    )
    assert "noloco" in proc.stdout and "world 2" in proc.stdout
    rows = metrics(tmp_path)
    rounds = [r["outer/round"] for r in rows if "outer/round" in r]
    assert rounds == [1.0, 2.0, 3.0]
    assert not any(r.get("outer/partner_missed") for r in rows)
    assert (tmp_path / "model/model.safetensors").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints/step_00000006").iterdir()) == ["rank_0", "rank_1"]


@pytest.mark.parametrize(
    "override,field",
    [
        ("algorithm.inner_steps=0", "algorithm.inner_steps=0"),
        ("launcher.nproc_per_node=3", "algorithm.odd_world"),
    ],
)
def test_bad_input_fails_before_training_naming_the_field(tmp_path, override, field):
    proc = run_train(tmp_path, "algorithm=noloco", "train.global_batch_size=6", override, ok=False)
    out = proc.stdout + proc.stderr
    assert field in out
    assert not (tmp_path / "metrics.jsonl").exists()
