"""compressed_sync's own arithmetic: grids that bracket, bytes to a target, the paired test, the headline ratio."""

import pytest

from benchmarks.compressed_sync import (LADDER, bytes_to, figures_for, next_rungs, paired, seed_mean_curve, start_grid,
                                        sync_bytes)

pytestmark = pytest.mark.unit


def test_grids_start_around_a_rung_and_grow_only_at_an_edge():
    assert start_grid("diloco") == [0.5, 0.7, 1.0]
    assert start_grid("sparseloco", {"sparseloco": 2.0}) == [1.4, 2.0, 2.8]
    assert start_grid("sparseloco", {"sparseloco": 4.0}) == [2.8, 4.0]  # the ladder's end
    assert next_rungs([0.5, 0.7, 1.0], {0.5: 2.0, 0.7: 1.9, 1.0: 2.1}) == []  # bracketed
    assert next_rungs([0.5, 0.7, 1.0], {0.5: 1.8, 0.7: 1.9, 1.0: 2.1}) == [0.35]
    assert next_rungs([0.5, 0.7, 1.0], {0.5: 2.2, 0.7: 1.9, 1.0: 1.7}) == [1.4]
    assert next_rungs([1.4, 2.0], {1.4: 2.0, 2.0: 1.0}) == [2.8]
    assert next_rungs([2.8, 4.0], {2.8: 2.0, 4.0: 1.0}) == [] and LADDER[-1] == 4.0  # nothing past the ladder


def test_sync_bytes_diloco_is_dense_fp32_and_the_others_are_logged():
    rows = [{"step": 5, "outer/pseudo_grad_norm": 1.0}, {"step": 7}, {"step": 10, "outer/pseudo_grad_norm": 1.0}]
    assert sync_bytes("diloco", rows, 100, 4) == ([5, 10], [400.0, 400.0], [600.0, 600.0])  # ring: 2(N−1)/N
    rows = [{"step": 5, "outer/bytes_sent": 30.0, "outer/payload_bytes": 10.0, "outer/payload_dropped": 0.0}]
    assert sync_bytes("sparseloco", rows, 100, 4) == ([5], [10.0], [30.0])
    with pytest.raises(RuntimeError, match="dropped"):
        sync_bytes("sparseloco", [{**rows[0], "outer/payload_dropped": 1.0}], 100, 4)


def test_bytes_to_target_is_the_first_eval_at_or_below_it():
    runs = [{"curve": [[20, 3.0, 10, 20], [40, 2.0, 20, 40]]}, {"curve": [[20, 2.0, 10, 20], [40, 1.0, 20, 40]]}]
    curve = seed_mean_curve(runs)
    assert curve == [[20, 2.5, 10, 20], [40, 1.5, 20, 40]]
    assert bytes_to(curve, 2.5) == (20, 10, 20) and bytes_to(curve, 2.0) == (40, 20, 40) and bytes_to(curve, 1.0) is None


def test_paired_test_interval_and_detectable_effect():
    p = paired([0.1, 0.2, 0.3])
    assert p["mean"] == pytest.approx(0.2) and p["p"] == pytest.approx(0.0742, abs=1e-3)  # t = 3.46, df 2
    assert p["ci95"] == pytest.approx([0.2 - 4.303 * 0.1 / 3 ** 0.5, 0.2 + 4.303 * 0.1 / 3 ** 0.5], abs=1e-3)
    assert p["detectable"] == pytest.approx((4.303 + 1.061) * 0.1 / 3 ** 0.5, abs=1e-2)
    assert paired([0.5])["p"] is None


def _run(final, payload_per_sync, syncs=4):
    curve = [[20 * (i + 1), final + 0.5 * (3 - i), payload_per_sync * (i + 1), 2 * payload_per_sync * (i + 1)] for i in range(4)]
    return {"numel": 10, "curve": curve, "syncs": syncs, "final": final}


def test_figures_target_diloco_best_and_report_the_best_compressed_ratio():
    tuning = {"diloco": {"best_h": 20}}
    runs = {"diloco H=20": [_run(2.0, 1000), _run(2.02, 1000)], "diloco H=10": [_run(2.1, 2000), _run(2.1, 2000)],
            "sparseloco H=5": [_run(1.98, 10), _run(2.0, 10)], "sparseloco H=20": [_run(2.5, 5), _run(2.5, 5)]}
    f = figures_for(2, tuning, runs)
    assert f["diloco_best"] == "diloco H=20" and f["target_loss"] == pytest.approx(1.01 * 2.01)
    # DiLoCo reaches 2.0301 at its last eval (4000 B); SparseLoCo H=5 there too (40 B): 100x
    assert f["variants"]["sparseloco H=5"]["to_target"]["payload_ratio"] == pytest.approx(100.0)
    assert f["variants"]["sparseloco H=20"]["to_target"] is None
    assert f["best_ratio"][0] == "sparseloco H=5" and f["best_ratio"][1] == pytest.approx(100.0)
    assert f["variants"]["sparseloco H=5"]["vs_diloco_best"]["mean"] == pytest.approx(-0.02)
