"""benchmarks/ledger.py: seeds appended across sessions pool under their key, once each, and stay undecided until
they suffice."""

import json

import pytest

from benchmarks.ledger import Comparison, Ledger, key_id, verdict_lines

KEY = {"numerics": "abc", "corpus": {"name": "pinned", "hash": "h1"}, "gpu": "NVIDIA H200", "protocol": "p1"}


def seed(s: int, **bpb: float) -> dict:
    return {"seed": s, "arms": {arm: {"bpb": v} for arm, v in bpb.items()}}


def test_seeds_pool_across_appends_and_the_verdict_waits_for_enough_of_them(tmp_path):
    ledger = Ledger(tmp_path)
    better = [Comparison("noloco", "diloco", "better")]
    ledger.append("ev", KEY, [seed(0, noloco=1.30, diloco=1.40)], provenance={"dirty": False})
    one = ledger.pooled("ev", KEY, better)
    assert one["seeds"] == [0] and one["comparisons"][0]["verdict"] == "undecided"
    assert "one seed" in one["comparisons"][0]["why"]
    # a second session, a second batch: the pool holds both and the rule decides
    ledger.append(
        "ev", KEY, [seed(1, noloco=1.31, diloco=1.41), seed(2, noloco=1.29, diloco=1.40)], provenance={"dirty": False}
    )
    three = ledger.pooled("ev", KEY, better, rule={"margin": 0.01})
    row = three["comparisons"][0]
    assert three["seeds"] == [0, 1, 2] and row["n"] == 3 and row["verdict"] == "better"
    assert row["ci"][1] < 0 and row["contender_mean"] == pytest.approx(1.30)
    assert three["rule"] == {"margin": 0.01} and row["rule"]["margin"] == 0.01 and row["rule"]["claim"] == "better"
    assert verdict_lines(three)[0].startswith("noloco better diloco (bpb), 3 paired seed(s): better: -0.1")


def test_other_keys_dirty_lines_duplicates_and_torn_lines_stay_out_of_the_pool(tmp_path):
    ledger = Ledger(tmp_path)
    other = {**KEY, "corpus": {"name": "pinned", "hash": "h2"}}  # another corpus: never pooled with KEY's seeds
    ledger.append("ev", KEY, [seed(0, a=1.0, b=2.0)], provenance={"dirty": False})
    ledger.append("ev", other, [seed(1, a=1.0, b=2.0)], provenance={"dirty": False})
    ledger.append("ev", KEY, [seed(2, a=1.0, b=2.0)], provenance={"dirty": True})
    ledger.append("ev", KEY, [seed(0, a=9.0, b=9.0)], provenance={"dirty": False})  # seed 0 again: not independent
    with ledger.path("ev").open("a") as f:
        f.write('{"key_id": "x", "seed": 3, "rec')  # a write torn by a kill
    pool = ledger.pool("ev", KEY)
    assert list(pool.seeds) == [0] and pool.seeds[0]["arms"]["a"]["bpb"] == 1.0  # the first line for a seed wins
    assert (pool.duplicates, pool.excluded_dirty, pool.torn) == (1, 1, 1)
    assert sorted(ledger.pool("ev", KEY, include_dirty=True).seeds) == [0, 2]
    assert set(ledger.keys("ev")) == {key_id(KEY), key_id(other)}


def test_next_seeds_extend_the_pool_instead_of_repeating_it(tmp_path):
    ledger = Ledger(tmp_path)
    assert ledger.next_seeds("ev", KEY, 2) == [0, 1]
    ledger.append("ev", KEY, [seed(0, a=1.0), seed(2, a=1.0)], provenance={"dirty": True})  # used, even if not pooled
    assert ledger.next_seeds("ev", KEY, 3) == [1, 3, 4]
    assert ledger.next_seeds("ev", {**KEY, "gpu": "NVIDIA H100"}, 1) == [0]


def test_pairs_use_only_seeds_holding_both_arms_and_higher_is_better_reads_the_other_way(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append("ev", KEY, [seed(0, a=0.5, b=0.4), seed(1, a=0.6), seed(2, a=0.7, b=0.59), seed(3, a=0.9, b=0.81)])
    seen = {}

    def spy(con, base, rule):
        seen.update(con=con, base=base, rule=rule)
        return {"verdict": "undecided"}

    out = ledger.pooled("ev", KEY, [Comparison("a", "b", "better", higher_is_better=True)], decide_fn=spy)
    row = out["comparisons"][0]
    assert row["seeds"] == [0, 2, 3] and seen["con"] == [0.5, 0.7, 0.9] and seen["base"] == [0.4, 0.59, 0.81]
    assert seen["rule"] == {"claim": "better", "lower_is_better": False}
    # with the real rule: a higher accuracy on every seed is "better"
    assert (
        ledger.pooled("ev", KEY, [Comparison("a", "b", "better", higher_is_better=True)])["comparisons"][0]["verdict"]
        == "better"
    )


def test_a_rule_that_refuses_the_seeds_reads_undecided_with_its_reason(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append("ev", KEY, [seed(0, a=1.0, b=1.0), seed(1, a=1.0, b=1.0)])

    def refuses(con, base, rule):
        raise ValueError("zero variance")

    row = ledger.pooled("ev", KEY, [Comparison("a", "b", "reaches")], decide_fn=refuses)["comparisons"][0]
    assert row["verdict"] == "undecided" and row["why"] == "zero variance" and row["n"] == 2


def test_bad_records_and_names_fail_in_one_line(tmp_path):
    ledger = Ledger(tmp_path)
    with pytest.raises(ValueError, match="integer 'seed'"):
        ledger.append("ev", KEY, [{"seed": "0", "arms": {}}])
    with pytest.raises(ValueError, match="needs 'arms'"):
        ledger.append("ev", KEY, [{"seed": 0}])
    with pytest.raises(ValueError, match="plain file stem"):
        ledger.path("../x")
    with pytest.raises(ValueError, match="claim"):
        Comparison("a", "b", "wins")
    assert not ledger.path("ev").exists()  # nothing half-written by a refused append


def test_each_line_is_self_describing_json(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append("ev", KEY, [seed(5, a=1.0)], provenance={"git_sha": "0" * 40, "dirty": False})
    line = json.loads(ledger.path("ev").read_text())
    assert line["key"] == KEY and line["key_id"] == key_id(KEY) and line["seed"] == 5
    assert line["provenance"]["git_sha"] == "0" * 40 and line["record"]["arms"] == {"a": {"bpb": 1.0}}


def test_eight_seeds_decide_both_claims_under_the_real_rule(tmp_path):
    ledger = Ledger(tmp_path)
    noise = [0.004, -0.003, 0.002, -0.001, 0.003, -0.004, 0.001, -0.002]
    ledger.append(
        "ev", KEY, [seed(s, a=1.300 + noise[s], b=1.400 + 0.5 * noise[s], c=1.302 - noise[s]) for s in range(8)]
    )
    out = ledger.pooled(
        "ev", KEY, [Comparison("a", "b", "better"), Comparison("c", "a", "reaches"), Comparison("a", "b", "reaches")]
    )
    better, reaches, far = out["comparisons"]
    assert better["n"] == 8 and better["verdict"] == "better" and better["supported"]
    assert reaches["verdict"] == "reaches" and reaches["supported"]  # 0.15 % apart, inside the 1 % margin
    assert far["verdict"] == "better"  # 7 % lower: clearly better, which the rule reports as such
