"""compressed_sync's own arithmetic on the protocol: steps for 20 tokens/param, the tuning stages, bytes to a
target, verdicts from the fixed rules, and the compare preset it writes."""

from dataclasses import asdict

import pytest

from benchmarks.compressed_sync import (
    INNER_AT,
    MIN_RANKS,
    RULES,
    SPACES,
    bytes_to,
    compare_preset,
    figures_for,
    plan_steps,
    seed_mean_curve,
    sync_bytes,
    tune,
)
from benchmarks.protocol import Axis, recompute

pytestmark = pytest.mark.unit


def test_steps_read_twenty_tokens_per_parameter_and_end_on_every_sync():
    steps = plan_steps(92_400, 2048, 20)
    assert steps * 2048 / 92_400 >= 20 and (steps - 40) * 2048 / 92_400 < 20 and steps % 40 == 0
    assert all(steps % h == 0 for h in SPACES["sparseloco"]["h"].ladder)


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
    assert (
        bytes_to(curve, 2.5) == (20, 10, 20) and bytes_to(curve, 2.0) == (40, 20, 40) and bytes_to(curve, 1.0) is None
    )


class FakeHarness:
    """Runs no training: a job's final loss is a bowl in its settings; records every job."""

    def __init__(self):
        self.jobs = []

    def run_jobs(self, jobs, fn, desc=None, parallel=1):
        self.jobs += jobs
        return [
            {"final": abs(j["inner_lr"] - 2e-3) * 100 + abs(j["setting"]["lr"] - 1.0) + 0.001 * j["seed"]} for j in jobs
        ]


def test_tune_checks_the_inner_lr_once_then_every_arm_at_it():
    hz = FakeHarness()
    small = {
        m: {k: Axis(a.ladder, (a.start[len(a.start) // 2],), a.ordered) for k, a in sp.items()}
        for m, sp in SPACES.items()
    }
    plan = {
        "methods": ["diloco", "sparseloco", "noloco_c"],
        "spaces": small,
        "tuning_seeds": [100, 101],
        "finalists": 2,
        "max_rounds": 4,
        "parallel": 1,
    }
    shared = {"diloco_h": 20}
    out = tune(hz, shared, 2, plan)
    assert out["inner_lr"] == 2e-3 and out["inner"]["bracketed"]
    inner_jobs = [j for j in hz.jobs if j["setting"] == INNER_AT]
    assert {j["method"] for j in inner_jobs} == {"diloco"} and {j["seed"] for j in inner_jobs} == {100, 101}
    assert set(out["arms"]) == {"diloco", "sparseloco"} and MIN_RANKS["noloco_c"] == 4  # compressed NoLoCo needs N >= 4
    arm_jobs = [j for j in hz.jobs if j not in inner_jobs]
    assert all(j["inner_lr"] == 2e-3 for j in arm_jobs)
    assert all(j["h"] == 20 for j in arm_jobs if j["method"] == "diloco")
    assert all(j["h"] == j["setting"]["h"] for j in arm_jobs if j["method"] == "sparseloco")
    assert not any(j["setting"].get("nesterov") and j["setting"]["momentum"] == 0 for j in arm_jobs)
    assert out["arms"]["diloco"]["winner"]["lr"] == 1.0 and out["arms"]["sparseloco"]["winner"]["lr"] == 1.0


def _run(final, payload_per_sync, syncs=4):
    curve = [
        [20 * (i + 1), final + 0.5 * (3 - i), payload_per_sync * (i + 1), 2 * payload_per_sync * (i + 1)]
        for i in range(4)
    ]
    return {"numel": 10, "curve": curve, "syncs": syncs, "final": final, "final_bpb": None}


def _tuned(*arms):
    return {"arms": {m: {"winner": {"lr": 1.0}, "winner_values": [2.0, 2.01]} for m in arms}, "inner_lr": 1e-3}


def test_figures_decide_under_the_fixed_rule_and_give_the_byte_ratios():
    rules = {k: asdict(v) for k, v in RULES.items()}
    diloco = [_run(2.00 + 0.01 * (i % 3), 1000) for i in range(8)]
    sparse = [_run(2.00 + 0.01 * (i % 3) + 0.001 * (i % 2), 10) for i in range(8)]  # within ±1 %, tight
    f = figures_for(4, _tuned("diloco", "sparseloco"), {"diloco": diloco, "sparseloco": sparse}, rules)
    d = f["decisions"]["sparseloco_reaches_diloco"]
    assert d["result"]["verdict"] == "reaches" and recompute(d) == d["result"]
    a = f["arms"]["sparseloco"]
    assert a["payload_ratio_run"] == pytest.approx(100.0) and a["wire_ratio_run"] == pytest.approx(100.0)
    assert a["to_target"]["payload_ratio"] == pytest.approx(100.0)
    assert "noloco_c_reaches_diloco" not in f["decisions"]  # no arm, no decision
    noisy = [_run(2.0 + (0.2 if i % 2 else -0.2), 10) for i in range(8)]
    f = figures_for(4, _tuned("diloco", "sparseloco"), {"diloco": diloco, "sparseloco": noisy}, rules)
    assert f["decisions"]["sparseloco_reaches_diloco"]["result"]["verdict"] == "undecided"


def test_the_compare_preset_names_the_tuned_settings_and_what_stands_behind_them():
    rec = {
        "name": "compressed_sync",
        "git_sha": "abcdef1234567890",
        "config": {
            "tuning_seeds": [100, 101],
            "eval_seeds": list(range(8)),
            "diloco_h": 20,
            "steps": 920,
            "batch": 32,
            "data_name": "pinned",
            "seq_len": 64,
            "model": {"hidden": 48, "layers": 2, "heads": 2, "intermediate": 128},
        },
        "figures": {
            "cells": {
                "N=4": {
                    "tuning": {"inner_lr": 2e-3},
                    "arms": {
                        "diloco": {"setting": {"lr": 1.4, "momentum": 0.1, "nesterov": False}},
                        "sparseloco": {"setting": {"lr": 2.0, "ef_decay": 0.95, "h": 20}},
                        "noloco_c": {"setting": {}},
                    },
                }
            }
        },
    }
    p = compare_preset(rec, 4)
    assert p["workers"] == 4 and p["micro_batch_size"] == 8 and p["preset"] == "bench_n4"
    assert "data=pinned" in p["scale_overrides"] and "optim.lr=0.002" in p["scale_overrides"]
    assert "algorithm.outer_optimizer.nesterov=false" in p["arms"]["diloco"]["overrides"]
    assert set(p["arms"]) == {"diloco", "sparseloco"}
    assert (
        p["arms"]["sparseloco"]["behind"]
        == "benchmarks/results/compressed_sync.json @ abcdef1234: 2 tuning seeds, 8 eval seeds"
    )
    from recipes.comparison import CompareConfig

    cfg = CompareConfig(**{k: v for k, v in p.items()})  # the preset is a valid compare config
    assert cfg.arms["diloco"].behind.endswith("8 eval seeds")


def test_a_diverged_grid_point_loses_and_any_other_failure_stops_the_benchmark(monkeypatch):
    import math

    import decentrain.algorithms.pretraining.inprocess_replicas as replicas
    from benchmarks.compressed_sync import SIZES, train_run
    from benchmarks.scale import divergence

    def diverges(*a, **k):
        try:
            raise FloatingPointError("step 7: train loss is nan")
        except FloatingPointError as e:
            raise RuntimeError("in-process replica 0 failed") from e  # as run_replicas_in_process wraps it

    job = {
        "steps": 40,
        "model": SIZES["xs"],
        "seq_len": 64,
        "batch": 8,
        "data": {"name": "offline", "source": "offline"},
        "warmup": 1,
        "eval_every": 40,
        "eval_seqs": 8,
        "fixed": {"topk": 64, "bits": 2},
        "diloco_h": 20,
        "ranks": 2,
        "method": "diloco",
        "setting": {"lr": 4.0, "momentum": 0.95, "nesterov": True},
        "h": 20,
        "seed": 0,
        "inner_lr": 1e-3,
    }
    monkeypatch.setattr(replicas, "run_replicas_in_process", diverges)
    r = train_run(job)
    assert r["final"] == math.inf and "train loss is nan" in r["diverged"]
    monkeypatch.setattr(
        replicas, "run_replicas_in_process", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug"))
    )
    with pytest.raises(RuntimeError, match="a bug"):
        train_run(job)
    assert divergence(ValueError("x")) is None
