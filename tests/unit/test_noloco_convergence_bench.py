"""The NoLoCo-protocol benchmark's own arithmetic: replica averaging, curve means, the paired test and what it
can detect, steps to DiLoCo's best final loss, and the bracketing grid's pattern search."""

import math

import pytest
import torch
from scipy.stats import t as student
from scipy.stats import ttest_rel

from benchmarks.noloco_convergence import (LR_LADDER, TUNED, average_state, first_step_at, mean_curve, neighbours, open_axes,
                                           paired_test, steps_to_best, tune, verdict)

pytestmark = pytest.mark.unit


def test_average_state_averages_floats_and_keeps_the_rest():
    a = {"w": torch.tensor([1.0, 2.0]), "i": torch.tensor([3])}
    b = {"w": torch.tensor([3.0, 6.0]), "i": torch.tensor([5])}
    out = average_state([a, b])
    assert torch.equal(out["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(out["i"], torch.tensor([3]))


def test_mean_curve_is_the_pointwise_mean():
    c1 = [{"step": 8, "val_loss": 4.0}, {"step": 16, "val_loss": 3.0}]
    c2 = [{"step": 8, "val_loss": 5.0}, {"step": 16, "val_loss": 2.0}]
    assert mean_curve([c1, c2]) == [{"step": 8, "val_loss": 4.5}, {"step": 16, "val_loss": 2.5}]


def test_first_step_at_interpolates():
    curve = [{"step": 10, "val_loss": 4.0}, {"step": 20, "val_loss": 3.0}]
    assert first_step_at(curve, 3.5) == pytest.approx(15.0)
    assert first_step_at(curve, 4.5) == 10.0
    assert first_step_at(curve, 2.0) is None


def test_paired_test_matches_scipy_and_states_the_detectable_effect():
    x, y = [3.10, 3.02, 3.21, 3.05], [3.00, 3.01, 3.12, 3.00]
    out = paired_test(x, y)
    ref = ttest_rel(x, y)
    lo, hi = ref.confidence_interval(0.95)
    assert out["mean"] == pytest.approx(sum(a - b for a, b in zip(x, y)) / 4)
    assert out["ci95"] == pytest.approx([lo, hi])
    assert out["p"] == pytest.approx(ref.pvalue)
    se = out["std"] / math.sqrt(4)
    assert out["detectable"] == pytest.approx((student.ppf(0.975, 3) + student.ppf(0.8, 3)) * se)
    assert out["detectable"] > hi - out["mean"]  # 80 % power needs more than the interval's half-width
    single = paired_test([1.0], [2.0])
    assert single["mean"] == -1.0 and single["ci95"] is None and single["detectable"] is None


def test_verdict_decides_only_when_the_interval_excludes_zero():
    assert verdict(paired_test([1.0, 1.1, 0.9], [2.0, 2.05, 1.95]), "x lower", "y lower") == "x lower"
    assert verdict(paired_test([2.0, 2.1, 1.9], [1.0, 1.0, 1.0]), "x lower", "y lower") == "y lower"
    assert verdict(paired_test([1.0, 2.0, 0.5], [1.2, 1.1, 1.0]), "x lower", "y lower").startswith("no difference detected")
    assert verdict(paired_test([1.0], [2.0]), "x lower", "y lower").startswith("undecided")


def test_steps_to_best_targets_the_lower_of_the_reference_finals():
    curves = {"noloco_H": [{"step": 10, "val_loss": 3.0}, {"step": 20, "val_loss": 2.0}],
              "diloco_2H": [{"step": 10, "val_loss": 3.2}, {"step": 20, "val_loss": 2.6}],
              "diloco_H": [{"step": 10, "val_loss": 3.1}, {"step": 20, "val_loss": 2.5}],
              "ddp": [{"step": 10, "val_loss": 3.5}, {"step": 20, "val_loss": 2.8}]}
    out = steps_to_best(curves, ["diloco_2H", "diloco_H"])
    assert out["target_val_loss"] == 2.5
    assert out["steps"]["noloco_H"] == pytest.approx(15.0)
    assert out["steps"]["diloco_H"] == 20.0 and out["steps"]["diloco_2H"] is None and out["steps"]["ddp"] is None


def test_neighbours_and_open_axes_know_the_ladders_ends():
    assert sorted(neighbours((3, 3))) == [(2, 3), (3, 2), (3, 4), (4, 3)]
    assert sorted(neighbours((len(LR_LADDER) - 1, 0))) == [(len(LR_LADDER) - 2, 0), (len(LR_LADDER) - 1, 1)]
    seen = {(3, 3), (2, 3), (4, 3), (3, 2)}
    assert open_axes((3, 3), seen) == ["momentum"]
    assert open_axes((3, 3), seen | {(3, 4)}) == []
    assert open_axes((len(LR_LADDER) - 1, 3), {(len(LR_LADDER) - 2, 3), (len(LR_LADDER) - 1, 2), (len(LR_LADDER) - 1, 4)}) == ["lr"]


class _BowlHarness:
    """Runs no training: a job's 'final val loss' is a bowl in (log lr, momentum) with its minimum at `at`."""

    def __init__(self, at):
        self.at, self.jobs = at, []

    def run_jobs(self, jobs, fn, desc=None, parallel=1):
        self.jobs += jobs
        out = []
        for j in jobs:
            lr0, m0 = self.at[j["arm"]]
            o = j["outer_optimizer"]
            out.append({"final_val_loss": (math.log(o["lr"]) - math.log(lr0)) ** 2 + (o["momentum"] - m0) ** 2})
        return out


def _job(arm, opt, n, seed):
    return {"arm": arm, "workers": n, "seed": seed, "outer_optimizer": opt}


def test_tune_walks_until_the_winner_is_bracketed_and_flags_a_ladder_end():
    at = {"noloco_H": (1.4, 0.8), "diloco_2H": (0.7, 0.3), "diloco_H": (2.0, 0.3)}
    hz = _BowlHarness(at)
    grid = tune(hz, _job, 8, max_rounds=6, parallel=1)
    assert {a: (g["best"]["lr"], g["best"]["momentum"]) for a, g in grid.items()} == at
    assert grid["noloco_H"]["bracketed"] and grid["noloco_H"]["rounds"] == 5  # 4 ladder moves from 0.7/0.5, then its neighbours
    # the paper's point wins: its 4 neighbours bracket it, nothing else is run
    assert grid["diloco_2H"]["bracketed"] and len(grid["diloco_2H"]["rows"]) == 5
    assert not grid["diloco_H"]["bracketed"] and grid["diloco_H"]["edge"] == ["lr"]  # 2.0 is the ladder's (and config's) end
    assert all(j["seed"] == 0 and j["workers"] == 8 for j in hz.jobs) and set(TUNED) == set(grid)
    assert len(hz.jobs) == len({(j["arm"], j["outer_optimizer"]["lr"], j["outer_optimizer"]["momentum"]) for j in hz.jobs})  # each once


def test_tune_stops_after_max_rounds_and_says_the_winner_is_open():
    hz = _BowlHarness({"noloco_H": (2.0, 0.9), "diloco_2H": (0.25, 0.0), "diloco_H": (0.7, 0.3)})
    grid = tune(hz, _job, 8, max_rounds=2, parallel=1)
    assert grid["noloco_H"]["rounds"] == 2 and not grid["noloco_H"]["bracketed"] and grid["noloco_H"]["edge"]
    assert grid["diloco_H"]["bracketed"]
