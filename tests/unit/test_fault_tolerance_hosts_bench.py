"""benchmarks/fault_tolerance_hosts.py's bookkeeping: what the run can resolve, the rate target decided on its interval,
and the replacement's heal as the event."""

import json
import subprocess
import sys

import pytest

from benchmarks import fault_tolerance_hosts as F


def _none(rate):
    return {"survivors": {str(r): {"steps_per_min": rate} for r in F.SURVIVORS}}


def test_the_rate_target_is_decided_only_outside_the_no_fault_runs_spread():
    # 1.05x: 0.9 outside the band
    assert "cannot mask it" in F.detectable({"none/s0": _none(100.0), "none/s1": _none(105.0)})
    assert "neither meet nor miss" in F.detectable({"none/s0": _none(100.0), "none/s1": _none(164.0)})  # 1.64x: inside
    assert "one no-fault run" in F.detectable({"none/s0": _none(100.0), "kill/s0": _none(90.0)})


def test_wait_healed_returns_once_every_replacement_rank_logged_a_new_heal(tmp_path):
    # rank 2 healed before the kill (an old mark) and again after; rank 3 logs its heal later: wait for both.
    (tmp_path / "metrics.rank2.jsonl").write_text(json.dumps({"heal/seconds": 1.0}) + "\n")
    before = {r: F.heal_marks(tmp_path, r) for r in F.DEAD_RANKS}
    assert before == {2: 1, 3: 0}
    with open(tmp_path / "metrics.rank2.jsonl", "a") as f:
        f.write(json.dumps({"heal/seconds": 0.5}) + "\n")
    alive = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (tmp_path / "metrics.rank3.jsonl").write_text(json.dumps({"step": 1}) + "\n")
        assert F.heal_marks(tmp_path, 3) == 0
        (tmp_path / "metrics.rank3.jsonl").write_text(json.dumps({"heal/seconds": 0.7}) + "\n")
        assert F.wait_healed(tmp_path, 0.0, before, [alive], timeout_s=60) is not None  # both ranks have a new mark
        assert F.wait_healed(tmp_path, 0.0, {2: 2, 3: 1}, [alive], timeout_s=0.5) is None  # no newer mark: times out
    finally:
        alive.stdin.close()
        alive.wait()
    # a launcher that exited ends the wait too (a failed replacement must not hang the benchmark)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert F.wait_healed(tmp_path, 0.0, {2: 5, 3: 5}, [done], timeout_s=60) is None


def _runs(ratios):
    runs = {}
    for s, ratio in enumerate(ratios):
        runs[f"none/s{s}"] = {**_none(100.0), "eval_loss": 1.0}
        runs[f"kill/s{s}"] = {
            "survivors": {
                str(r): {"steps_per_min": 100.0 * ratio, "rolled_back": 0, "rounds_lost": 0} for r in F.SURVIVORS
            },
            "eval_loss": 1.0,
            "replacements": {str(r): {"healed": True, "kill_to_contributing_s": 18.0} for r in F.DEAD_RANKS},
        }
        runs[f"none/s{s}"]["survivors"] = {
            k: {**v, "rolled_back": 0, "rounds_lost": 0} for k, v in runs[f"none/s{s}"]["survivors"].items()
        }
    return {"figures": {"runs": runs}}


def test_the_rate_target_is_decided_on_the_interval_not_the_point_estimate():
    # the committed run's ratios: mean 0.943 >= 0.9, but the 95 % interval [0.877, 1.009] straddles the target
    f = F.figures_of(_runs([0.955, 0.912, 0.961]))
    d = f["decisions"]["survivors_ge_target"]["result"]
    assert d["verdict"] == "undecided" and not f["targets"]["survivors_ge_0.9_of_no_fault_rate"]
    assert d["ci"][0] + F.RATE_TARGET == pytest.approx(0.877, abs=1e-3) and d["seeds_needed"] == 6
    f = F.figures_of(_runs([0.95, 0.94, 0.96, 0.95]))
    assert (
        f["decisions"]["survivors_ge_target"]["result"]["verdict"] == "better"
        and f["targets"]["survivors_ge_0.9_of_no_fault_rate"]
    )
