"""benchmarks/protocol.py: the decision rule against scipy, TOST that cannot decide, and the tuning search
(a winner on its grid's edge extends the grid; tuning seeds that disagree are flagged)."""

import math

import pytest
from scipy import stats

from benchmarks.protocol import (
    Axis,
    DecisionRule,
    check_seeds,
    consistency,
    decide,
    decision,
    decisions_in,
    detectable,
    grid_search,
    power_of,
    preregister,
    recompute,
    seeds_needed,
)

pytestmark = pytest.mark.unit

X = [2.31, 2.35, 2.29, 2.40, 2.33, 2.36, 2.30, 2.34]
Y = [2.41, 2.44, 2.37, 2.47, 2.45, 2.42, 2.39, 2.46]


def test_better_interval_and_p_match_scipy():
    out = decide(X, Y, DecisionRule("better"))
    ref = stats.ttest_rel(X, Y)
    assert out["ci"] == pytest.approx(list(ref.confidence_interval(0.95)))
    assert out["p"] == pytest.approx(ref.pvalue)
    assert out["mean_diff"] == pytest.approx(sum(a - b for a, b in zip(X, Y)) / 8)
    assert out["verdict"] == "better" and out["supported"] and out["n"] == 8
    assert decide(Y, X, DecisionRule("better"))["verdict"] == "worse"
    # higher is better (a rate): the same numbers read the other way
    assert decide(Y, X, DecisionRule("better", lower_is_better=False))["verdict"] == "better"


def test_tost_matches_scipy_one_sided_tests_and_decides_equivalence():
    a = [2.400, 2.405, 2.398, 2.402, 2.401, 2.399, 2.403, 2.400]
    b = [2.401, 2.404, 2.400, 2.401, 2.399, 2.400, 2.404, 2.401]
    out = decide(a, b, DecisionRule("reaches"))
    d = [x - y for x, y in zip(a, b)]
    bound = 0.01 * abs(sum(b) / len(b))
    p_lo = stats.ttest_1samp(d, -bound, alternative="greater").pvalue
    p_hi = stats.ttest_1samp(d, bound, alternative="less").pvalue
    assert out["bound"] == pytest.approx(bound) and out["p_tost"] == pytest.approx(max(p_lo, p_hi))
    assert out["ci_tost"] == pytest.approx(list(stats.ttest_1samp(d, 0).confidence_interval(0.90)))
    assert out["verdict"] == "reaches" and out["supported"]


def test_a_tost_that_cannot_decide_says_undecided():
    # mean difference ~0 but the seeds scatter by ±0.1: the 90 % interval spills over ±1 % of 2.4
    a = [2.30, 2.50, 2.35, 2.48, 2.41, 2.29, 2.52, 2.37]
    b = [2.40] * 8
    out = decide(a, b, DecisionRule("reaches"))
    assert out["verdict"] == "undecided" and not out["supported"]
    assert out["p_tost"] > 0.05 and out["detectable"] > 0
    assert out["seeds_needed_tost"] is None or out["seeds_needed_tost"] > 8
    assert decide([2.3, 2.5], [2.4, 2.4], DecisionRule("reaches"))["verdict"] == "undecided"
    assert decide([2.3], [2.4], DecisionRule("better"))["verdict"] == "undecided"  # one seed: no interval


def test_a_fixed_target_is_a_one_sample_test():
    rates = [0.955, 0.912, 0.961]  # fault_tolerance_hosts' survivors, 3 seeds, against the 0.9 target
    out = decide(rates, [0.9] * 3, DecisionRule("better", lower_is_better=False))
    ref = stats.ttest_1samp(rates, 0.9)
    assert out["ci"] == pytest.approx([x - 0.9 for x in ref.confidence_interval(0.95)])
    assert out["verdict"] == "undecided" and out["ci"][0] < 0 < out["ci"][1]
    assert out["seeds_needed"] is not None and out["seeds_needed"] > 3


def test_power_and_detectable_effect_against_the_textbook():
    assert power_of(10, 1.0, 1.0) == pytest.approx(0.803, abs=0.002)  # paired t, d = 1, n = 10 (G*Power: 0.8031)
    e = detectable(10, 1.0)
    assert power_of(10, e, 1.0) == pytest.approx(0.8, abs=1e-4) and 0.9 < e < 1.0
    assert seeds_needed(1.0, 1.0) == 10
    assert seeds_needed(0.0, 1.0) is None


def test_bad_rule_fails_naming_the_field():
    with pytest.raises(ValueError, match="claim"):
        DecisionRule("faster")
    with pytest.raises(ValueError, match="margin"):
        DecisionRule("reaches", margin=5)


class Bowl:
    """A loss surface: (log2 lr - log2 lr*)^2 + (m - m*)^2 (+ a seed offset); counts every run."""

    def __init__(self, lr, m, bimodal=None):
        self.lr, self.m, self.bimodal, self.cells = lr, m, bimodal or {}, []

    def __call__(self, cells):
        self.cells += cells
        out = []
        for s, seed in cells:
            v = (math.log2(s["lr"]) - math.log2(self.lr)) ** 2 + (s["momentum"] - self.m) ** 2 + 0.001 * seed
            out.append(v + self.bimodal.get((s["lr"], s["momentum"], seed), 0.0))
        return out


LR = Axis((0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0), start=(0.5, 0.7, 1.0))
MOM = Axis((0.0, 0.1, 0.3, 0.5, 0.7, 0.9), start=(0.3, 0.5, 0.7))


def test_a_grid_whose_winner_sits_on_its_edge_is_extended():
    bowl = Bowl(lr=2.0, m=0.5)
    t = grid_search(bowl, {"lr": LR, "momentum": MOM}, [100, 101])
    assert t["winner"] == {"lr": 2.0, "momentum": 0.5} and t["bracketed"]
    run = {(s["lr"], s["momentum"]) for s, _ in bowl.cells}
    assert {(1.4, 0.5), (2.0, 0.5), (2.8, 0.5)} <= run  # one rung beyond the edge, repeated, then past the winner
    assert (4.0, 0.5) not in run  # the walk stops once the winner is bracketed
    assert t["runner_up"] is not None and t["runner_up_mean"] > t["winner_mean"]
    assert len(t["winner_values"]) == 2 and t["rounds"] > 1
    assert len(bowl.cells) == len(set((tuple(s.items()), seed) for s, seed in bowl.cells))  # each run once


def test_the_screen_runs_only_the_finalists_on_the_second_seed_and_ladder_ends_are_named():
    bowl = Bowl(lr=0.25, m=0.0)
    t = grid_search(bowl, {"lr": LR, "momentum": MOM}, [100, 101], finalists=2)
    assert t["winner"] == {"lr": 0.25, "momentum": 0.0} and t["bracketed"]
    assert sorted(t["at_ladder_end"]) == ["lr", "momentum"]
    second = [s for s, seed in bowl.cells if seed == 101]
    assert len(second) < len([s for s, seed in bowl.cells if seed == 100])
    t = grid_search(Bowl(lr=4.0, m=0.5), {"lr": LR, "momentum": MOM}, [100, 101], max_rounds=1)
    assert not t["bracketed"] and t["open_axes"] == ["lr"]  # rounds ran out with the winner on the edge


def test_invalid_points_are_skipped_and_choices_have_no_edge():
    nest = Axis((False, True), start=(False, True), ordered=False)
    bowl = Bowl(lr=0.7, m=0.0)
    t = grid_search(
        bowl,
        {"lr": LR, "momentum": MOM, "nesterov": nest},
        [1, 2],
        valid=lambda s: not (s["nesterov"] and s["momentum"] == 0),
    )
    assert not any(s["nesterov"] and s["momentum"] == 0 for s, _ in bowl.cells)
    assert t["bracketed"] and t["winner"]["lr"] == 0.7 and t["winner"]["momentum"] == 0.0


def test_two_tuning_seeds_that_disagree_are_flagged():
    # the chosen point wins on one seed by a mode the other seed does not share (DiLoCo 2H's heavy-ball 1.4/0.1)
    bowl = Bowl(lr=0.7, m=0.5, bimodal={(1.0, 0.5, 100): -0.8})
    t = grid_search(bowl, {"lr": LR, "momentum": MOM}, [100, 101], finalists=None)
    d = t["disagreement"]
    assert t["winner"] == {"lr": 1.0, "momentum": 0.5} and d["flagged"] and any("differ by" in w for w in d["why"])
    calm = grid_search(Bowl(lr=0.7, m=0.5), {"lr": LR, "momentum": MOM}, [100, 101], finalists=None)
    assert not calm["disagreement"]["flagged"] and calm["disagreement"]["noise"] == pytest.approx(0.001)
    one = grid_search(Bowl(lr=0.7, m=0.5), {"lr": LR, "momentum": MOM}, [100])
    assert not one["disagreement"]["flagged"] and "one tuning seed" in one["disagreement"]["why"][0]


def test_tuning_against_evaluation_seeds():
    c = consistency([2.30, 2.31], [2.49, 2.50, 2.48, 2.51, 2.49, 2.50, 2.47, 2.50])
    assert c["flagged"] and c["eval_stds_apart"] > 10
    assert not consistency([2.49, 2.50], [2.49, 2.50, 2.48, 2.51])["flagged"]


def test_seeds_rules_and_recomputed_verdicts(tmp_path):
    assert check_seeds([100, 101], range(8)) == []
    assert len(check_seeds([0], [0, 1, 2])) == 3
    rules = {"x": DecisionRule("better")}
    preregister(tmp_path, "bench", rules)
    preregister(tmp_path, "bench", rules)  # the same rules resume
    with pytest.raises(SystemExit, match="fixed when this run began"):
        preregister(tmp_path, "bench", {"x": DecisionRule("reaches")})
    preregister(tmp_path, "bench", {"x": DecisionRule("reaches")}, fresh=True)
    entry = decision("x", "a", "b", DecisionRule("better"), X, Y, "eval/loss")
    assert recompute(entry) == entry["result"] and decisions_in({"f": [{"g": entry}]}) == [entry]


def test_every_committed_decision_is_its_own_values_under_its_own_rule():
    """Verdicts are computed from the record, never typed: each stored decision recomputes to itself."""
    import json

    from benchmarks.record import RESULTS

    seen = 0
    for path in sorted(RESULTS.glob("*.json")):
        for entry in decisions_in(json.loads(path.read_text())["figures"]):
            again, stored = recompute(entry), entry["result"]
            assert again["verdict"] == stored["verdict"] and again["supported"] == stored["supported"], (
                path.name,
                entry["name"],
            )
            assert again["ci"] == pytest.approx(stored["ci"]) and again["mean_diff"] == pytest.approx(
                stored["mean_diff"]
            )
            seen += 1
    assert seen > 0
