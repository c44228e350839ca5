"""Adaptive gossip deadlines: median + k·MAD of observed arrivals, capped by deadline_s."""

import pytest

from decentrain.algorithms.noloco import NoLoCoConfig
from decentrain.core.comm.deadline import AdaptiveDeadlineConfig, ArrivalWindow, adaptive_deadline


def test_median_plus_k_mads_by_hand():
    # median 3; |a − 3| = 2, 1, 0, 1, 7 -> MAD 1; 3 + 6·1 = 9
    assert adaptive_deadline([1, 2, 3, 4, 10], k=6, margin=0.5, cap=20) == pytest.approx(9.0)
    assert adaptive_deadline([1, 2, 3, 4, 10], k=6, margin=0.5, cap=5) == 5  # the fixed deadline caps it
    # even count: median (2 + 4)/2 = 3; deviations 2, 1, 1, 5 -> MAD (1 + 2)/2 = 1.5; 3 + 2·1.5 = 6
    assert adaptive_deadline([1, 2, 4, 8], k=2, margin=0.1, cap=60) == pytest.approx(6.0)
    # identical arrivals: MAD 0, the margin gives room for jitter
    assert adaptive_deadline([2.0, 2.0, 2.0], k=6, margin=0.5, cap=60) == pytest.approx(2.5)
    assert adaptive_deadline([], k=6, margin=0.5, cap=7) == 7


def test_window_starts_at_the_cap_forgets_old_arrivals_and_misses_widen_it():
    w = ArrivalWindow(cap=10.0, cfg=AdaptiveDeadlineConfig(enabled=True, k=6, window=4, warmup=3, margin_s=0.5))
    w.arrived(1.0)
    w.arrived(1.0)
    assert w.deadline() == 10.0  # warm-up: fewer than 3 arrivals
    w.arrived(1.0)
    assert w.deadline() == pytest.approx(1.5)
    for _ in range(4):  # the window (4) now holds only the new, slower arrivals
        w.arrived(3.0)
    assert list(w.arrivals) == [3.0] * 4 and w.deadline() == pytest.approx(3.5)
    w = ArrivalWindow(cap=10.0, cfg=AdaptiveDeadlineConfig(enabled=True, k=6, window=8, warmup=1, margin_s=0.5))
    w.arrived(1.0)
    seen = []
    for _ in range(12):  # the link got slower than any deadline so far: each miss is a censored arrival
        d = w.deadline()
        seen.append(d)
        w.missed(d)
    assert seen == sorted(seen) and seen[0] == 1.5 and seen[-1] == 10.0  # grows to the cap, never shrinks


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"k": -1}, "k"),
        ({"window": 0}, "window"),
        ({"warmup": 5, "window": 4}, "warmup"),
        ({"margin_s": 0.0}, "margin_s"),
        ({"window": 2.5}, "window"),
    ],
)
def test_bad_adaptive_deadline_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"adaptive_deadline.{field}"):
        AdaptiveDeadlineConfig(**kwargs)


def test_adaptive_deadline_needs_the_fixed_one_as_its_cap():
    with pytest.raises(ValueError, match="needs algorithm.deadline_s"):
        NoLoCoConfig(adaptive_deadline=AdaptiveDeadlineConfig(enabled=True))
    NoLoCoConfig(deadline_s=30.0, adaptive_deadline=AdaptiveDeadlineConfig(enabled=True))
