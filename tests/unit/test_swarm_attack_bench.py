"""benchmarks/swarm_attack: the new attackers' payloads are what they claim to be, and the table's
ratios and target are computed per seed against that seed's no-attack run."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import swarm_attack as sa  # noqa: E402
from decentrain.algorithms.sapo.payload import PayloadDecoder, PayloadLimits  # noqa: E402


def _decode(data: bytes, round_: int):
    return PayloadDecoder(PayloadLimits(num_generations=sa.G))(data, current_round=round_)


def test_sybil_payloads_are_valid_signed_and_distinct_per_identity():
    a, b = sa.Framer(), sa.Framer()
    pa, pb = _decode(sa.sybil_payload(a, 0, 5), 5), _decode(sa.sybil_payload(b, 1, 5), 5)
    assert pa is not None and pb is not None and pa.node_id != pb.node_id  # two identities, both valid
    assert len(pa.groups) == sa.SYBIL_GROUPS
    assert {g.index for g in pa.groups}.isdisjoint({g.index for g in pb.groups})
    assert all(len(set(g.completions)) == 2 for g in pa.groups)  # usable: right and wrong answers


def test_hijack_copies_the_honest_groups_under_the_attackers_key_plus_junk():
    honest, attacker = sa.Framer(), sa.Framer()
    item = sa._questions(sa.DEFAULT_TASK)[0]
    groups = [honest.real_group(item, [item.answer] * sa.G)]
    published = honest.frame(honest.body(3, groups))
    out = sa.hijack_payload(attacker, 4, [published, b"not a payload"])
    decoded = _decode(out, 4)
    assert decoded is not None and decoded.node_id == attacker.node_id
    body = json.loads(out.split(b"\n", 1)[1])
    assert body["groups"][0] == groups[0] and len(body["groups"]) == 1 + sa.HIJACK_JUNK
    assert sa.hijack_payload(attacker, 5, [b"junk"]) is None  # nothing to copy: nothing published


def test_tail_injection_completions_carry_text_after_the_stop_string():
    fr = sa.Framer()
    [data] = sa.hostile_payloads("tail_injection", fr, 2, Path("/nonexistent"))
    decoded = _decode(data, 2)
    assert decoded is not None
    assert all(any("\n" in c and c.split("\n", 1)[1] for c in g.completions) for g in decoded.groups)


def _run(rounds, ext, crashes=0, window=10.0):
    return {
        "rounds": rounds,
        "window_s": window,
        "external_per_round": ext,
        "crashes": crashes,
        "files_created": [],
        "rss_peak_mib": 100.0,
        "rss_growth_mib": 1.0,
    }


def test_summary_ratios_are_per_seed_and_the_target_needs_mean_ratios_and_no_crash():
    runs = {
        "none": [_run(100, 2.0), _run(50, 1.0)],
        "ok_attack": [_run(95, 1.9), _run(50, 1.0)],
        "slow_attack": [_run(50, 2.0), _run(50, 1.0)],
        "crash_attack": [_run(100, 2.0, crashes=1), _run(50, 1.0)],
    }
    s = sa.summarize(runs)
    assert s["ok_attack"]["rounds_ratio_mean"] == pytest.approx(0.975) and s["ok_attack"]["ok"]
    assert s["slow_attack"]["rounds_ratio_min"] == pytest.approx(0.5) and not s["slow_attack"]["ok"]
    assert not s["crash_attack"]["ok"] and s["crash_attack"]["crashes"] == 1
    table = sa._table(s)
    assert (
        table.count("\n") == 1 + len(runs)
        and "| slow_attack | 2 | 0.75 ± 0.35 (0.50) | 1.00 ± 0.00 (1.00) | 0.75" in table
    )
    assert s["ok_attack"]["external_per_s_ratio_mean"] == pytest.approx((0.95 * 0.95 + 1) / 2)
