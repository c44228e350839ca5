"""The NoLoCo benchmark's own arithmetic on the protocol: replica averaging, curve means, steps to DiLoCo's best
final loss, the inner lr checked once, every arm tuned over all its outer settings, and decisions from the fixed
rules."""

import math

import pytest
import torch

from benchmarks.noloco_convergence import (
    ARMS,
    INNER_AT,
    RULES,
    SPACES,
    TUNED,
    analyse,
    average_state,
    first_step_at,
    mean_curve,
    readme_row,
    steps_to_best,
    tune,
)
from benchmarks.protocol import Axis, recompute

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


def test_steps_to_best_targets_the_lower_of_the_reference_finals():
    curves = {
        "noloco_H": [{"step": 10, "val_loss": 3.0}, {"step": 20, "val_loss": 2.0}],
        "diloco_2H": [{"step": 10, "val_loss": 3.2}, {"step": 20, "val_loss": 2.6}],
        "diloco_H": [{"step": 10, "val_loss": 3.1}, {"step": 20, "val_loss": 2.5}],
        "ddp": [{"step": 10, "val_loss": 3.5}, {"step": 20, "val_loss": 2.8}],
    }
    out = steps_to_best(curves, ["diloco_2H", "diloco_H"])
    assert out["target_val_loss"] == 2.5
    assert out["steps"]["noloco_H"] == pytest.approx(15.0)
    assert out["steps"]["diloco_H"] == 20.0 and out["steps"]["diloco_2H"] is None and out["steps"]["ddp"] is None


class _BowlHarness:
    """Runs no training: a job's final val loss is a bowl in (log lr, momentum) with its minimum at `at`, heavy ball
    ahead of Nesterov by 0.01, and the inner lr best at 3e-3."""

    def __init__(self, at):
        self.at, self.jobs = at, []

    def run_jobs(self, jobs, fn, desc=None, parallel=1):
        self.jobs += jobs
        out = []
        for j in jobs:
            lr0, m0 = self.at[j["arm"]]
            o = j["outer_optimizer"]
            v = (math.log(o["lr"]) - math.log(lr0)) ** 2 + (o["momentum"] - m0) ** 2 + 0.01 * bool(o.get("nesterov"))
            out.append({"final_val_loss": v + 10 * abs(j["inner_lr"] - 3e-3) + 0.001 * j["seed"]})
        return out


def _job(arm, setting, n, seed, inner_lr):
    from benchmarks.noloco_convergence import outer

    return {"arm": arm, "workers": n, "seed": seed, "outer_optimizer": outer(arm, setting), "inner_lr": inner_lr}


def test_tune_checks_the_inner_lr_once_then_brackets_every_arm_on_two_seeds():
    at = {"noloco_H": (1.4, 0.8), "diloco_2H": (0.7, 0.3), "diloco_H": (2.0, 0.1)}
    hz = _BowlHarness(at)
    plan = {
        "tuning_seeds": [100, 101],
        "finalists": 4,
        "max_rounds": 8,
        "parallel": 1,
        "spaces": {**SPACES, "inner": {"inner_lr": Axis((7.5e-4, 1.5e-3, 3e-3, 6e-3), (3e-3,))}},
    }
    out = tune(hz, _job, 8, plan)
    assert out["inner_lr"] == 3e-3 and out["inner"]["bracketed"]
    inner = [
        j
        for j in hz.jobs
        if j["arm"] == INNER_AT[0]
        and j["outer_optimizer"]["lr"] == 0.7
        and j["outer_optimizer"]["momentum"] == 0.3
        and j["inner_lr"] != 3e-3
    ]
    assert inner  # the inner-lr ladder ran at DiLoCo 2H's paper point
    for a in TUNED:
        w = out["arms"][a]["winner"]
        assert (w["lr"], w["momentum"]) == at[a] and out["arms"][a]["bracketed"]
        assert out["arms"][a]["seeds"] == [100, 101] and len(out["arms"][a]["winner_values"]) == 2
    assert out["arms"]["diloco_2H"]["winner"]["nesterov"] is False  # heavy ball vs Nesterov is searched too
    assert "nesterov" not in out["arms"]["noloco_H"]["winner"]
    assert all(j["inner_lr"] == 3e-3 for j in hz.jobs if j not in inner)
    assert not any(j["outer_optimizer"].get("nesterov") and j["outer_optimizer"]["momentum"] == 0 for j in hz.jobs)


def _result(test, val=None):
    curve = [{"step": 16, "val_loss": test + 0.5}, {"step": 32, "val_loss": val if val is not None else test}]
    return {
        "final_test_loss": test,
        "final_test_ppl": math.exp(test),
        "final_val_loss": val or test,
        "final_test_loss_avg_model": test,
        "test_loss_replica_spread": 0.0,
        "train_s": 1.0,
        "val_curve": curve,
        "params": 1000,
        "corpus": None,
    }


def test_analyse_decides_each_comparison_from_the_fixed_rules():
    seeds = list(range(8))
    shift = {"noloco_H": -0.05, "diloco_2H": 0.0, "diloco_H": 0.0, "ddp": -0.2}
    res = {(8, a, s): _result(2.5 + shift[a] + 0.01 * (s % 3)) for a in ARMS for s in seeds}
    tuning = {
        "arms": {
            a: {
                "winner": {"lr": 0.7, "momentum": 0.5, **({"nesterov": False} if a != "noloco_H" else {})},
                "winner_values": [2.5, 2.51],
            }
            for a in TUNED
        }
    }
    fits = {
        "emulated/pair": {"alpha_s": 0.01, "beta_bytes_per_s": 1e7},
        "emulated/ring": {"alpha_s": 0.01, "beta_bytes_per_s": 1e7},
    }
    rules = {k: vars(v).copy() for k, v in RULES.items()}
    cell = analyse(res, 8, seeds, 1000, 8, 32, 1024, fits, tuning, rules)
    d = cell["decisions"]
    assert (
        d["noloco_H_vs_diloco_2H"]["result"]["verdict"] == "better"
        and d["noloco_H_vs_ddp"]["result"]["verdict"] == "worse"
    )
    assert all(recompute(x) == x["result"] for x in d.values())
    assert cell["arms"]["diloco_2H"]["outer_optimizer"] == {
        "name": "sgd",
        "lr": 0.7,
        "momentum": 0.5,
        "nesterov": False,
    }
    rec = {
        "config": {"protocol": {"noloco_H": 8, "diloco_2H": 16}, "seeds": seeds, "tuning": {"seeds": [100, 101]}},
        "figures": {"cells": {"N=8": cell}, "steps": 32, "tokens_per_param": 21.0, "unmet": []},
    }
    assert "N=8 **better**" in readme_row(rec)
    assert cell["arms"]["ddp"]["final_test_bpb"] is None  # results cached before bits were recorded have none
    for a in ARMS:
        for s in seeds:
            res[(8, a, s)]["final_test_bpb"] = 1.5 + 0.1 * s
    bpb = analyse(res, 8, seeds, 1000, 8, 32, 1024, fits, tuning, rules)["arms"]["ddp"]["final_test_bpb"]
    assert bpb["values"] == [1.5 + 0.1 * s for s in seeds]
