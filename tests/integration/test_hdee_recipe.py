"""HDEE end to end: seed, two experts as parallel jobs, ensemble evaluation, scoring a text file."""

import json

import pytest

from decentrain.testing import run_recipe

pytestmark = pytest.mark.integration


def test_train_evaluate_and_score_a_smoke_ensemble(tmp_path):
    ens = tmp_path / "ens"
    common = ["hdee_plan=smoke", f"ensemble_dir={ens}"]
    proc = run_recipe("recipes.hdee_train", *common)
    assert "compute +0.00% vs the homogeneous baseline" in proc.stdout
    for job in ("seed-M", "lane0", "lane1"):
        assert "exited with 0" in proc.stdout.split(f"job {job}")[-1].splitlines()[0]
    for name in ("seed-M", "lane0-it0-M", "lane0-it1-M", "lane1-it0-M"):
        assert (ens / name / "model" / "model.safetensors").exists(), name

    proc = run_recipe("recipes.ensemble_eval", *common, "eval.domains=[licenses,arithmetic]")
    results = json.loads((ens / "eval_test.json").read_text())["results"]
    assert set(results) == {"licenses", "arithmetic"}  # arithmetic: held out from every expert
    for r in results.values():
        assert set(r["weightings"]) == {"uniform", "cached", "topk", "average"}
        assert set(r["experts"]) == {"lane0-it1-M", "lane1-it0-M"}
    assert "cached" in proc.stdout

    text = tmp_path / "mine.txt"
    text.write_text("Permission is hereby granted, free of charge, to any person obtaining a copy\n" * 3)
    proc = run_recipe("recipes.ensemble_score", str(text), f"ensemble_dir={ens}", "eval.weightings=[uniform,average]")
    scored = json.loads(proc.stdout.strip().splitlines()[-1])
    assert scored["tokens"] > 0 and set(scored["weightings"]) == {"uniform", "average"}


def test_bad_plans_fail_before_any_job_starts(tmp_path):
    ens = tmp_path / "ens"
    proc = run_recipe(
        "recipes.hdee_train", "hdee_plan=smoke", f"ensemble_dir={ens}", "plan.lanes.1.steps=[9]", ok=False
    )
    assert "off the homogeneous baseline" in proc.stderr and not (ens / "logs").exists()
    proc = run_recipe("recipes.ensemble_eval", "hdee_plan=smoke", f"ensemble_dir={ens}", ok=False)
    assert "expert lane0-it1-M (lanes[0]) has no checkpoint" in proc.stderr
