"""The fault benchmark's figures from metrics rows (benchmarks/fault_tolerance.py), on hand-made rows."""

import pytest

from benchmarks.fault_tolerance import pairings_with, rank_figures, ratios, rejoin, rounds_lost, run_figures, target


def _rows(n_steps: int = 9, h: int = 4, missed=(), dt: float = 0.5) -> list[dict]:
    rows = []
    for s in range(1, n_steps + 1):
        r = {"step": s, "time": 100.0 + dt * s, "train/loss": 5.0 - 0.1 * s, "perf/step_ms": 10.0 + s}
        if s % h == 0:
            r |= {
                "outer/round": float(s // h),
                "outer/partner_missed": float(s // h - 1 in missed),
                "perf/step_ms": 500.0,
            }
        rows.append(r)
    rows.append({"step": n_steps, "time": 100.0 + dt * n_steps, "eval/loss": 3.25})
    return rows


def test_rank_figures_window_compute_and_rounds():
    fig = rank_figures(_rows(missed=(1,)), fault_at=102.0)
    assert fig["steps"] == 9 and fig["window_s"] == 4.0
    assert fig["steps_per_min"] == 60 * 8 / 4.0  # 8 step intervals over the window, start-up excluded
    assert fig["compute_ms"] == 15.0  # median of steps 1-3, 5-7, 9 (the syncs at 4 and 8 left out)
    assert fig["compute_ms_after_fault"] == 16.5  # steps 5, 6, 7, 9 (times >= 102): 15, 16, 17, 19 ms
    assert fig["final_eval_loss"] == 3.25 and fig["finished"] and fig["rounds_jumped"] == 0
    assert fig["rounds"] == [(0, 102.0, False), (1, 104.0, True)]
    assert rank_figures(_rows(n_steps=1)) is None


def test_rejoin_counts_rounds_from_the_faults_end():
    faulty = {"rounds": [(0, 1.0, False), (1, 2.0, True), (2, 3.0, True), (3, 4.0, False)]}
    assert rejoin(faulty, 1.5) == {"round": 3, "rounds": 3, "seconds": 2.5}
    assert rejoin(faulty, 4.5)["rounds"] is None  # never averaged again
    assert rejoin(None, 1.0)["rounds"] is None


def test_rounds_lost_splits_pairings_with_the_faulty_rank_from_spill_over():
    # pairing seed 0, 4 ranks: rank 0 meets rank 2 in rounds 2..6
    assert pairings_with(0, 2, 8) == {2, 3, 4, 5, 6}
    survivor = {"rounds": [(t, t + 1.0, t in (1, 2, 3, 5, 7)) for t in range(8)]}
    # fault at 2.5 (first round after it: 2); rank 2 back from round 5: 2, 3 unavoidable;
    # 1 (before), 5 (after), 7 (other partner) not
    assert rounds_lost(survivor, 0, 2.5, 5) == {"with_faulty": 2, "beyond": 3}
    assert rounds_lost(survivor, 0, 2.5, None) == {"with_faulty": 3, "beyond": 2}  # a kill: rank 2 never back


def test_run_figures_and_ratios_per_survivor():
    per_rank = {r: rank_figures(_rows(dt=0.5 if r != 1 else 1.0)) for r in range(4)}
    base = run_figures({r: rank_figures(_rows()) for r in range(4)}, {}, "none")
    run = run_figures(per_rank, {"fault_at": 101.0}, "kill")
    assert sorted(run["survivors"]) == ["0", "1", "3"] and run["faulty"]["steps"] == 9
    assert ratios(run, base, "steps_per_min") == (1 + 0.5 + 1) / 3  # rank 1 ran at half speed


def test_target_checks_every_scenario_and_names_failures():
    t = target(
        {"loopback/kill": 0.95, "loopback/stop": 0.5, "wan/partition": None}, lambda x: x is not None and x >= 0.9
    )
    assert t["met"] is False and t["failed"] == {"loopback/stop": 0.5, "wan/partition": None}
    assert target({"a": 0, "b": 0}, lambda x: x == 0) == {"met": True, "checked": ["a", "b"], "failed": {}}
    assert target({}, bool)["met"] is None  # nothing ran: neither met nor failed


def test_torchft_figures_from_rows_and_logs(tmp_path):
    from benchmarks.fault_tolerance_torchft import ready_times, rolled_back, unequal_syncs

    def row(step, t, committed, s):
        return {"step": step, "time": t, "train/loss": 1.0, "ft/committed_steps": committed, "ft/global_sum": s}

    a = [row(1, 1.0, 0, 5.0), row(2, 2.0, 1, 6.0), row(3, 3.0, 2, 7.0)]
    b = [row(1, 1.0, 0, 9.0), row(2, 2.0, 1, 6.0), row(3, 3.0, 2, 7.5)]
    assert unequal_syncs(a, b, after=1.5) == 1  # sync 2 differs; sync 0 is before `after`
    assert rolled_back([row(1, 1, 0, 0), row(2, 2, 0, 0), row(1, 3, 0, 0), row(2, 4, 0, 0)]) == 2
    log = tmp_path / "train.log"
    log.write_text(
        "[2026-11-24 00:04:44,618][x][INFO] - [rank 0] [decentrain] diloco: 1M params, from scratch; run dir r\n"
        "[2026-11-24 00:05:00,000][x][INFO] - [rank 0] other line\n"
        "[2026-11-24 00:05:10,500][x][INFO] - [rank 0] [decentrain] ddp: 1M params, resumed from step 25; run dir r\n"
    )
    first, second = ready_times(log)
    assert second - first == pytest.approx(25.882)
