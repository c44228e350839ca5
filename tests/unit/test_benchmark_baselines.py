"""Committed benchmark results: one schema, and headline figures inside their baselines' tolerances.

Reads JSON only (no benchmark runs). A regenerated result whose headline figure regresses past its
baseline (`benchmarks/baselines/<name>.json`) fails here, as does a result in an older layout (run
`python -m benchmarks.harness --upgrade benchmarks/results/*.json`) or one without a baseline.
"""

import ast
import copy
import json
import shutil

import pytest

from benchmarks.record import (
    BASELINES,
    RESULTS,
    SCHEMA_ID,
    check_baseline,
    figure_at,
    upgrade_record,
    validate_baseline,
    validate_record,
)

RESULT_FILES = sorted(RESULTS.glob("*.json"))
BASELINE_FILES = sorted(BASELINES.glob("*.json"))


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_every_committed_result_is_in_the_one_schema(path):
    assert validate_record(json.loads(path.read_text())) == []


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_every_committed_result_is_within_its_baseline(path):
    baseline = BASELINES / path.name
    assert baseline.exists(), (
        f"{path.name} has no baseline: add benchmarks/baselines/{path.name} (headline figures, tolerance, why)"
    )
    assert check_baseline(json.loads(path.read_text()), json.loads(baseline.read_text())) == []


@pytest.mark.parametrize("path", BASELINE_FILES, ids=lambda p: p.stem)
def test_every_baseline_is_well_formed_and_can_fail(path):
    baseline = json.loads(path.read_text())
    assert validate_baseline(baseline) == [] and baseline["result"] == path.stem
    assert (RESULTS / f"{path.stem}.json").exists(), "a baseline without its result"
    for fig in baseline["figures"]:  # a target recorded as not met could never fail: it guards nothing
        assert fig["value"] is not False, f"{fig['path']}: a false target cannot regress"


def _regressed(fig: dict) -> float:
    """A value just past the tolerance on the worse side (a boolean target: not met)."""
    if isinstance(fig["value"], bool):
        return False
    step = fig["tolerance"] + max(abs(fig["value"]) * 0.01, 1e-6)
    return fig["value"] + step if fig["better"] == "lower" else fig["value"] - step


def test_a_regressed_copy_fails_and_an_improved_one_passes(tmp_path):
    # every baseline figure, regressed in a copy of its committed result, is caught
    for bpath in BASELINE_FILES:
        baseline = json.loads(bpath.read_text())
        shutil.copy(RESULTS / f"{bpath.stem}.json", tmp_path / bpath.name)
        for fig in baseline["figures"]:
            rec = json.loads((tmp_path / bpath.name).read_text())
            parent = figure_at(rec, fig["path"][:-1])
            parent[fig["path"][-1]] = _regressed(fig)
            (tmp_path / "mutated.json").write_text(json.dumps(rec))
            problems = check_baseline(json.loads((tmp_path / "mutated.json").read_text()), baseline)
            assert len(problems) == 1 and "/".join(map(str, fig["path"])) in problems[0], (bpath.name, fig["path"])
    # moving the other way is an improvement, not a failure; a vanished figure is a failure
    rec = json.loads((RESULTS / "wire_path.json").read_text())
    baseline = json.loads((BASELINES / "wire_path.json").read_text())
    rec["figures"]["pair_vs_ring"] = 0.5  # baseline 1.05, lower is better
    assert check_baseline(rec, baseline) == []
    del rec["figures"]["pair_vs_ring"]
    assert check_baseline(rec, baseline) == ["figures/pair_vs_ring: missing from the result"]
    rec["figures"]["pair_vs_ring"] = None
    assert len(check_baseline(rec, baseline)) == 1


def test_schema_violations_are_named():
    rec = json.loads((RESULTS / "noloco_convergence.json").read_text())
    assert validate_record(rec) == []
    bad = copy.deepcopy(rec)
    bad["git_sha"] += "-dirty"
    del bad["hardware"]["cpu"]
    bad["compute_s"] = "9122"
    bad["extra"] = 1
    bad["dirty"] = True  # and still not_for_commit False
    assert sorted(validate_record(bad)) == sorted(
        [
            "git_sha: expected 40 lowercase hex digits, got '" + rec["git_sha"] + "-dirty'",
            "hardware.cpu: missing",
            "compute_s: expected int/float/NoneType, got str",
            "extra: unknown key",
            "not_for_commit: a dirty tree's result must be marked not_for_commit",
        ]
    )
    del bad["figures"]
    assert "figures: missing" in validate_record(bad)
    assert validate_record(True) == ["record: expected dict, got bool"]


RESULTS_IO = {  # the layout benchmarks/results_io.py wrote before the one harness
    "name": "w",
    "config": {"numel": 4},
    "figures": {"ratio": 1.5, "nested": {"x": [1, 2]}},
    "environment": {
        "git_sha": "a" * 40 + "-dirty",
        "python": "3.11.7",
        "torch": "2.13.0",
        "transformers": "5.23.0",
        "platform": "Linux",
        "cpu": "x86_64",
        "cpu_count": 2,
        "cuda": None,
    },
}


def test_upgrade_maps_the_results_io_layout_and_is_idempotent():
    new = upgrade_record(RESULTS_IO)
    assert validate_record(new) == []
    assert new["schema"] == SCHEMA_ID and new["git_sha"] == "a" * 40 and new["dirty"] and new["not_for_commit"]
    assert new["hardware"] == {
        "cpu": "x86_64",
        "cpu_count": 2,
        "platform": "Linux",
        "cuda": None,
        "load_avg_at_start": None,
    }
    assert new["versions"] == {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.23.0"}
    assert new["figures"] == RESULTS_IO["figures"] and new["config"] == RESULTS_IO["config"]
    assert new["compute_s"] is None and "environment" not in new
    assert upgrade_record(new) == new and list(upgrade_record(new)) == list(new)


def test_upgrade_maps_the_old_harness_layout_keeping_its_key_order():
    old = {
        k: v
        for k, v in json.loads((RESULTS / "sapo_round_time.json").read_text()).items()
        if k not in ("schema", "dirty", "command")
    }
    new = upgrade_record(old)
    assert validate_record(new) == [] and new["dirty"] is old["not_for_commit"] and new["command"] is None
    assert [k for k in new if k in old] == list(old)  # a small diff against the committed file


def test_upgrade_cli_rewrites_files_once(tmp_path, capsys):
    from benchmarks.harness import main

    p = tmp_path / "w.json"
    p.write_text(json.dumps(RESULTS_IO, indent=2))
    assert main(["--upgrade", str(p)]) == 0
    first = p.read_text()
    assert validate_record(json.loads(first)) == [] and "upgraded" in capsys.readouterr().out
    assert main(["--upgrade", str(p)]) == 0 and p.read_text() == first and capsys.readouterr().out == ""
    p.write_text(json.dumps({"name": "x"}))
    assert main(["--validate", str(p)]) == 1


SCRIPTS = [
    p
    for p in sorted(RESULTS.parent.glob("*.py"))
    if p.stem
    not in (
        "__init__",
        "harness",
        "record",
        "common",
        "fault_tolerance_netns",
        "repro_table",
        "ledger",
        "gpu_efficiency",
        "protocol",
        "claims",
        "scale",
    )
]  # helpers


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_every_benchmark_takes_its_command_line_from_the_harness(path):
    tree = ast.parse(path.read_text())
    harness_names = {
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "benchmarks.harness"
        for a in n.names
    }
    assert harness_names & {"bench_parser", "config_parser"}, "build the parser with benchmarks.harness"
    assert "Harness" in harness_names or "reanalyse" in harness_names, "write results through benchmarks.harness"
    private = [
        f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("benchmarks.")
        for a in n.names
        if a.name.startswith("_")
    ]
    assert not private, f"another script's private helper: {private} (shared pieces go in benchmarks/common.py)"
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "ArgumentParser"
    ]
    assert not calls, "a hand-made argparse.ArgumentParser: use benchmarks.harness.bench_parser"
