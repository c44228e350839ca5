"""benchmarks/overlap_utilisation: the emulated link's time and the wall time to a target loss."""

from __future__ import annotations

import pytest
import torch

from benchmarks.overlap_utilisation import ComputeClock, EmulatedLink, LinkClock, time_to
from decentrain.core.comm.inprocess_transport import InProcessHub


class FakeTime:
    """The benchmark module's clock, injected: sleeping advances it, nothing else does."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_link_time_is_latency_per_message_plus_bytes_over_rate(monkeypatch):
    import benchmarks.overlap_utilisation as bench

    hub = InProcessHub(2)
    # 12.5 MB at 100 Mbit/s is 1 s; 50 ms each way
    links = [EmulatedLink(hub.transport(r), 12.5e6, 100e6, 0.05, LinkClock(scale=1.0)) for r in range(2)]
    assert links[0].ring_time() == pytest.approx(2 * 0.05 + 1.0)  # N=2 ring: 2 messages, S uploaded
    assert links[0].link_seconds == pytest.approx(1.1)
    # 1.1 s played as 0.1 s
    fast = [EmulatedLink(hub.transport(r), 12.5e6, 100e6, 0.05, LinkClock(scale=11.0)) for r in range(2)]
    flats = [torch.ones(3), torch.full((3,), 2.0)]
    clock = FakeTime()  # an injected clock: what is waited is counted, whatever the box's load
    monkeypatch.setattr(bench, "time", clock)
    works = [link.all_reduce_sum(f) for link, f in zip(fast, flats)]
    assert clock.slept == []  # starting a sync does not wait for the link
    for w in works:
        w.wait()
    # the first wait plays the link; both end then
    assert clock.slept[0] == pytest.approx(0.1) and clock.slept[1] == 0.0
    assert flats[0].tolist() == [3.0, 3.0, 3.0]


def test_wall_time_to_target_sums_steps_up_to_the_first_eval_below_it():
    result = {"replicas": [{"step_wall_s": [1.0, 2.0, 3.0, 4.0]}], "evals": [(2, 5.0), (4, 3.0)]}
    assert time_to(result, 5.0) == 3.0 and time_to(result, 3.5) == 10.0 and time_to(result, 1.0) is None


def test_link_clock_plays_the_first_sync_as_a_share_of_a_round():
    compute = ComputeClock()
    compute.seconds = {"replica-0": [0.1, 0.3, 0.2]}  # median 0.2 s, H = 5: a round is 1 s
    clock = LinkClock(ratio=0.5, h=5, compute=compute)
    assert clock.scale_for(40.0) == pytest.approx(80.0)  # 40 s played as 0.5 s
    assert clock.scale_for(4.0) == pytest.approx(80.0)  # then fixed


def _result(final, utilisation, evals):
    return {
        "final_eval": final,
        "utilisation": utilisation,
        "sync_over_round": 0.6,
        "evals": evals,
        "replicas": [{"step_wall_s": [1.0] * 10}],
    }


def test_each_arm_is_timed_to_the_no_overlap_runs_final_loss_and_the_delay_cost_is_reported():
    """Overlap ends 0.1 worse: the old target (the worse of the two finals) called that a speed-up; now the overlap
    arm never reaches its no-overlap run's final loss, and the cost stands beside the utilisation gain."""
    from benchmarks.overlap_utilisation import summarise

    off = _result(2.0, 0.5, [(5, 2.5), (10, 2.0)])
    on = _result(2.1, 0.9, [(3, 2.5), (10, 2.1)])
    row = summarise({"m/off": [off], "m/on": [on]}, ["m"], [0])["m"]
    assert row["target_eval"] == [2.0]
    assert row["off"]["wall_to_target_s"]["mean"] == 10.0 and row["on"]["wall_to_target_s"] is None
    assert row["on"]["reached_target"] == 0 and row["speedup_to_target"] is None
    assert row["utilisation_gain"]["mean"] == pytest.approx(0.4)
    assert row["loss_cost_of_delay"]["mean"] == pytest.approx(0.1) and row["loss_cost_of_delay_pct"][
        "mean"
    ] == pytest.approx(5.0)
    on_ok = _result(1.9, 0.9, [(3, 2.0), (10, 1.9)])
    row = summarise({"m/off": [off], "m/on": [on_ok]}, ["m"], [0])["m"]
    assert row["speedup_to_target"]["mean"] == pytest.approx(10 / 3)
