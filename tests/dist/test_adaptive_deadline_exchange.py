"""Pooled buffers give the right mean every round; a late partner costs the learnt deadline, not the cap."""

import time

import pytest
import torch

from decentrain.testing import average, run_ranks

from decentrain.core.deadline import AdaptiveDeadlineConfig, ArrivalWindow
from decentrain.core.exchange import PairExchange

pytestmark = pytest.mark.dist


def _late_in_round_3(world):
    ex = PairExchange(world, deadline_s=20.0, reuse_buffers=True)
    ex.arrivals = ArrivalWindow(20.0, AdaptiveDeadlineConfig(enabled=True, k=6, window=8, warmup=3, margin_s=0.3))
    t = [torch.full((1000,), float(world.rank))]
    for r in range(3):
        t = [torch.full((1000,), float(world.rank + 10 * r))]
        mean = average(ex, t, (0, 1), r)
        assert mean is not None and torch.equal(mean[0], torch.full((1000,), 0.5 + 10 * r)), r  # reused buffers, new values
        time.sleep(0.1)  # the send's completion hands its buffer back (from the helper thread)
        if r == 0:
            allocated = ex._pool.allocated
    assert ex._pool.allocated == allocated  # warm after round 0: no new model-sized buffer per round
    if world.rank == 1:
        time.sleep(1.5)
    start = time.perf_counter()
    out = average(ex, t, (0, 1), 3)
    return out is None, time.perf_counter() - start, ex.stats.early_timeouts, ex.stats.deadline_s


def test_late_partner_is_dropped_at_the_learnt_deadline_and_counted():
    (dropped, waited, early, deadline), _ = run_ranks(_late_in_round_3, 2, timeout=60)
    assert dropped and early == 1
    assert deadline < 1.2 and waited < 1.4  # median of fast arrivals + 0.3 s margin, far below the 20 s cap
