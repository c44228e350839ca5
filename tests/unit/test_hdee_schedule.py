"""HDEE at the paper's schedule: domain phases at their own optimizer, experts as checkpoints of one LR schedule."""

import dataclasses
import json
import math

import pytest

from decentrain.algorithms.hdee.config import expert_config
from decentrain.algorithms.hdee.train import run_stage
from decentrain.config import OptimConfig
from decentrain.core.world import World
from decentrain.testing import tiny_hdee_config


def test_a_lane_may_not_run_past_the_shared_schedule(tmp_path):
    cfg = tiny_hdee_config(tmp_path, widths=(64, 64, 64), steps=2)
    with pytest.raises(ValueError, match=r"lanes\[0\] \(lane0\)\.steps=\[2\] runs past plan\.domain_schedule_steps=1"):
        dataclasses.replace(cfg.plan, domain_schedule_steps=1)


def test_expert_config_swaps_in_the_domain_phase_optimizer(tmp_path):
    cfg = tiny_hdee_config(tmp_path)
    assert expert_config(cfg) is cfg  # None: the seeds' optimizer
    low = OptimConfig(lr=1e-4, warmup_steps=1)
    assert expert_config(dataclasses.replace(cfg, expert_optim=low)).optim == low


def _final_lr(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["lr"] for r in rows if "lr" in r][-1]


def test_experts_stop_inside_one_schedule_at_the_domain_phase_lr(tmp_path):
    """Two 2-step experts, one with its own 2-step cosine, one stopping at step 2 of a 4-step cosine."""
    low = OptimConfig(lr=1e-4, warmup_steps=1, min_lr_ratio=0.5)
    finals = {}
    for schedule in (None, 4):
        cfg = tiny_hdee_config(tmp_path / str(schedule), widths=(64,), steps=2)
        cfg = dataclasses.replace(
            cfg,
            expert_optim=low,
            logger=dataclasses.replace(cfg.logger, log_every=1),
            plan=dataclasses.replace(cfg.plan, domain_schedule_steps=schedule),
        )
        run_stage(cfg, World())
        finals[schedule] = _final_lr(tmp_path / str(schedule) / cfg.plan.final_experts()[0])
        # the seed keeps `optim`: 0.1 x 2e-3 at its end
        assert _final_lr(tmp_path / str(schedule) / "seed-64") == pytest.approx(2e-4)
    assert finals[None] == pytest.approx(0.5e-4)  # the end of its own cosine: min_lr_ratio x lr
    assert 0.5e-4 < finals[4] < 1e-4  # still inside the longer cosine


def test_bench_statistics_by_hand():
    from benchmarks import hdee_schedule as H

    # Sign test: 10 of 10 pairs favour het -> p = 2 / 2^10; 1 of 3 -> p = 2 * (1 + 3) / 8 = 1.
    assert H.sign_test([-1.0] * 10)["p_two_sided"] == pytest.approx(2 / 1024)
    assert H.sign_test([-1.0, 1.0, 1.0, 0.0]) == {"het_better": 1, "het_worse": 2, "p_two_sided": 1.0}
    # Lanes: easiest two first (3 shares), hardest two last (5 shares).
    assert H.lanes_by_difficulty({"a": 1, "b": 3, "c": 2, "d": 0.5, "e": 5, "f": 4}) == [
        ["d", "a"],
        ["c", "b"],
        ["f", "e"],
    ]
    # Two seeds, two domains: het better on one domain per seed by log(10/9).
    hom = {"x": {"cached": 10.0}, "y": {"cached": 10.0}}
    runs = [{"perplexity": {"homogeneous": hom, "het_steps": {"x": {"cached": 9.0}, "y": {"cached": 10.0}}}}] * 2
    st = H.budget_stats(runs, "cached")
    assert st["wins_per_seed"] == [1, 1]
    assert st["mean_dlogppl"]["mean"] == pytest.approx(math.log(0.9) / 2)


def test_bench_last_phase_steps_and_shared_runs():
    from types import SimpleNamespace

    from benchmarks import hdee_schedule as H
    from decentrain.algorithms.hdee.plan import EnsemblePlan, LaneConfig, SeedConfig

    # 3:4:5 shares of 3 x 16 = 48 steps: 12/16/20 (the paper's 300/400/500 around 400); equal totals.
    assert H.final_phase_steps(16, "het_steps") == [12, 16, 20]
    assert H.final_phase_steps(16, "homogeneous") == [16, 16, 16]
    assert sum(H.final_phase_steps(8, "het_steps")) == sum(H.final_phase_steps(8, "homogeneous")) == 24

    def plan(last):
        lanes = [LaneConfig(domains=[f"a{k}", f"b{k}"], steps=[16, n], intermediate_size=8) for k, n in enumerate(last)]
        return SimpleNamespace(
            plan=EnsemblePlan(seeds=[SeedConfig(intermediate_size=8)], lanes=lanes, tokens_per_step=1)
        )

    # Every iteration-0 run and the 4-share lane's last run are configured alike in both plans; the
    # 3- and 5-share lanes' last runs are not.
    assert H.shared_runs(plan([16, 16, 16]), plan([12, 16, 20])) == [
        "lane0-it0-M",
        "lane1-it0-M",
        "lane1-it1-M",
        "lane2-it0-M",
    ]
    # A run after a differing one is not shared even when its own steps agree.
    het = plan([16, 16, 16])
    het.plan.lanes[0] = LaneConfig(domains=["a0", "b0", "c0"], steps=[12, 16, 16], intermediate_size=8)
    hom = plan([16, 16, 16])
    hom.plan.lanes[0] = LaneConfig(domains=["a0", "b0", "c0"], steps=[16, 16, 16], intermediate_size=8)
    assert [n for n in H.shared_runs(hom, het) if n.startswith("lane0")] == []


def test_bench_structural_ties_are_neither_wins_nor_losses():
    """A domain whose lane's final expert is one shared run in both plans differs only by the other experts'
    weights (1e-5 to 1e-8 in the committed runs): it must leave the win counts, the mean and the sign test."""
    from benchmarks import hdee_schedule as H

    def ppl(x, y, z):
        return {"x": {"cached": x}, "y": {"cached": y}, "z": {"cached": z}}

    # x: het better; y: het worse; z: the shared lane's domain, a hair better for het on every seed.
    runs = [
        {
            "perplexity": {"homogeneous": ppl(10.0, 10.0, 10.0), "het_steps": ppl(9.0, 11.0, 10.0 - 1e-6)},
            "tied_domains": {"het_steps": ["z"]},
        }
    ] * 3
    st = H.budget_stats(runs, "cached")
    assert st["counted_domains"] == ["x", "y"] and st["tied_domains"] == ["z"]
    assert st["wins_per_seed"] == [1, 1, 1] and st["win_share_per_seed"] == [0.5, 0.5, 0.5]
    assert st["sign_test"] == {"het_better": 3, "het_worse": 3, "p_two_sided": 1.0}
    assert st["mean_dlogppl"]["mean"] == pytest.approx((math.log(0.9) + math.log(1.1)) / 2)
    assert "z" in st["dlogppl_per_domain"]  # still shown per domain


def test_bench_a_structural_tie_is_dropped_only_where_it_is_a_tie_under_the_weighting():
    """hdee_schedule @ 62b44cb dropped c_headers as a tie though het_sizes lost it on every seed under the cached
    prior (+0.012 log-ppl): the other experts' weights move a shared lane's ensemble perplexity. It counts now."""
    from benchmarks import hdee_schedule as H

    def ppl(x, y, z):
        return {"x": {"cached": x}, "y": {"cached": y}, "z": {"cached": z}}

    runs = [
        {
            "perplexity": {"homogeneous": ppl(10.0, 10.0, 10.0), "het_steps": ppl(9.0 + 0.01 * s, 9.5, 10.13)},
            "tied_domains": {"het_steps": ["z"]},
        }
        for s in range(3)
    ]
    st = H.budget_stats(runs, "cached")
    assert st["tied_domains"] == [] and st["structural_ties"] == ["z"] and st["counted_domains"] == ["x", "y", "z"]
    assert st["wins_per_seed"] == [2, 2, 2] and st["sign_test"]["het_worse"] == 3
    assert st["decision"]["result"]["n"] == 3  # the per-seed mean over all three domains, decided on its interval


def test_bench_tied_domains_and_specialisation_gate():
    from types import SimpleNamespace

    from benchmarks import hdee_schedule as H
    from decentrain.algorithms.hdee.plan import EnsemblePlan, LaneConfig, SeedConfig

    lanes = [LaneConfig(domains=[f"a{k}", f"b{k}"], steps=[16, 16], intermediate_size=8) for k in range(3)]
    cfg = SimpleNamespace(plan=EnsemblePlan(seeds=[SeedConfig(intermediate_size=8)], lanes=lanes, tokens_per_step=1))
    # only a shared FINAL expert ties
    assert H.tied_domains(cfg, ["lane0-it0-M", "lane1-it0-M", "lane1-it1-M"]) == ["a1", "b1"]
    # Gate: seed log-ppl 2.0 on both domains of one lane; the expert reaches exp(1.0) +- a little over seeds.
    # Each expert is measured against the seed of its own width: het_sizes' lane 0 is S, from seed-S.
    seed = {"M": {"a0": 2.0, "b0": 2.0}, "S": {"a0": 2.5, "b0": 2.5}}

    def runs(vals):
        return [
            {"experts": {v: {d: {f"lane0-it1-{H.LANE_SIZES[v][0]}": math.exp(x)} for d in seed["M"]} for v in H.PLANS}}
            for x in vals
        ]

    ok = H.specialisation(runs([0.99, 1.0, 1.01]), seed, [["a0", "b0"]], factor=10)  # gain 1.0 (S: 1.5), noise 0.01
    assert ok["passed"] and ok["per_plan"]["het_steps"][0]["gain_over_noise"] == pytest.approx(100)
    assert ok["per_plan"]["het_sizes"][0]["expert"] == "lane0-it1-S"
    assert ok["per_plan"]["het_sizes"][0]["gain"]["mean"] == pytest.approx(1.5)
    bad = H.specialisation(runs([0.85, 1.0, 1.15]), seed, [["a0", "b0"]], factor=10)  # gain 1.0, noise 0.15
    assert not bad["passed"]


def test_bench_het_sizes_plan_matches_the_homogeneous_compute_and_shares_its_m_lane(tmp_path):
    """het_sizes: lanes at 0.75x / 1x / 1.25x the FFN width (easiest smallest), each from the seed of its width,
    at the homogeneous steps: the same non-embedding FLOPs as homogeneous, and the M lane is homogeneous's own."""
    from benchmarks import hdee_schedule as H
    from decentrain.algorithms.hdee.config import check_plan
    from decentrain.config import register_configs

    register_configs("hdee")
    b = H.BenchConfig(seed_steps=8, work_dir=str(tmp_path))
    lanes = [["python_stdlib", "python_docs"], ["c_headers", "arithmetic"], ["changelogs", "licenses"]]
    cfgs = {v: H.plan_config(b, v, 16, lanes, 0) for v in H.PLANS}
    het = cfgs["het_sizes"].plan
    assert [lane.intermediate_size for lane in het.lanes] == [264, 352, 440]
    assert [lane.seed for lane in het.lanes] == ["seed-S", "seed-M", "seed-L"]
    assert {s.name: s.intermediate_size for s in het.seeds} == {"seed-S": 264, "seed-M": 352, "seed-L": 440}
    assert H.final_phase_steps(16, "het_sizes") == [16, 16, 16]
    assert H.shared_runs(cfgs["homogeneous"], cfgs["het_sizes"]) == ["lane1-it0-M", "lane1-it1-M"]
    assert H.tied_domains(cfgs["homogeneous"], ["lane1-it0-M", "lane1-it1-M"]) == ["c_headers", "arithmetic"]
    assert abs(check_plan(cfgs["het_sizes"])) < 1e-9  # relative compute difference to the homogeneous baseline


def test_ensemble_bench_drops_the_lane_both_plans_share():
    """hdee_ensemble: lane 1 (c_headers, changelogs) is M at 20 steps in homogeneous, het_steps (the 4 share)
    and het_sizes alike: the same run, so its domains are ties, never wins (main counted changelogs'
    +0.02 % +- 0.01 as a het_steps win)."""
    from benchmarks import hdee_ensemble as E
    from decentrain.config import register_configs

    register_configs("hdee")
    bench = E.BenchConfig()
    cfgs = {v: E.compose_variant(bench, v, 0)[1] for v in E.VARIANTS}
    assert E.structural_ties(cfgs["homogeneous"], cfgs["het_steps"]) == ["c_headers", "changelogs"]
    domains = E.eval_domains(cfgs["homogeneous"])
    hom = {d: {w: 10.0 for w in cfgs["homogeneous"].eval.weightings} for d in domains}
    het = {
        d: {w: (10.0 - 2e-3 * (1 + i) if d == "changelogs" else 10.5) for i, w in enumerate(hom[d])} for d in domains
    }
    perp = [
        {"homogeneous": hom, "het_steps": het, "het_sizes": hom},
        {"homogeneous": hom, "het_steps": het, "het_sizes": hom},
    ]
    out = E.analyze(bench, cfgs, perp)
    cached = out["per_plan"]["het_steps"]["cached"]
    assert "changelogs" not in cached["won"] + cached["won_raw"] and cached["won_per_seed"] == [0, 0]
    assert out["headline"]["het_steps"]["domains"] == len(domains) - 2
