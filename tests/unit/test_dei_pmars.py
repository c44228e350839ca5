"""Battles in pMARS: the canonical rendering fights exactly as the text it came from, limits hold."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest

from decentrain.algorithms.dei.pmars import BattleResult, PMarsConfig, battle, parse_output
from decentrain.algorithms.dei.redcode import parse
from decentrain.algorithms.dei.sft import shipped_warriors
from decentrain.testing import pmars_or_skip

WARRIORS = Path(__file__).resolve().parents[2] / "decentrain" / "algorithms" / "dei" / "warriors"


@pytest.fixture(scope="module")
def pmars() -> str:
    return pmars_or_skip()


def _pmars_on_files(binary: str, files: list[Path], seed_pos: int, rounds: int = 10) -> str:
    cmd = [
        binary,
        "-b",
        "-r",
        str(rounds),
        "-s",
        "8000",
        "-c",
        "80000",
        "-p",
        "8000",
        "-l",
        "100",
        "-d",
        "100",
        "-F",
        str(seed_pos),
        *map(str, files),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout


def test_canonical_rendering_fights_exactly_as_the_original_text(pmars, tmp_path):
    # pMARS assembles the shipped source itself (labels, EQU, default modifiers); the result of
    # the same battle must not change when it reads our canonical rendering instead.
    names = sorted(p.stem for p in WARRIORS.glob("*.red"))
    cfg = PMarsConfig(rounds=10)
    for a, b in itertools.combinations(names, 2):
        # battle(seed=7) places warrior 2 at min_distance + 7
        original = _pmars_on_files(pmars, [WARRIORS / f"{a}.red", WARRIORS / f"{b}.red"], seed_pos=100 + 7)
        results = [ln for ln in original.splitlines() if ln.startswith("Results:")]
        wa, wb = parse((WARRIORS / f"{a}.red").read_text()).warrior, parse((WARRIORS / f"{b}.red").read_text()).warrior
        ours = battle([wa, wb], cfg, seed=7)
        won, lost, tied = (int(x) for x in results[0].split()[1:])
        assert ours.placings == ((won, tied), (lost, tied)) and ours.losses == (lost, won), (a, b, original)


def test_battles_are_a_function_of_warriors_and_seed(pmars):
    ws = shipped_warriors()
    cfg = PMarsConfig(rounds=8)
    first = battle([ws["paper"], ws["imp"], ws["dwarf"]], cfg, seed=3)
    assert battle([ws["paper"], ws["imp"], ws["dwarf"]], cfg, seed=3) == first
    assert sum(first.placings[0]) + first.losses[0] == 8
    # the imp cannot kill: a lone imp never wins a round against a stone
    duel = battle([ws["imp"], ws["dwarf"]], cfg, seed=5)
    assert duel.placings[0][0] == 0 and 0.0 <= duel.share(0) <= 2.0


def test_a_battle_past_its_time_limit_is_none_not_an_error(pmars):
    ws = shipped_warriors()
    slow = PMarsConfig(rounds=30000, cycles=80000, timeout_s=0.2)
    assert battle([ws["imp"], ws["imp"]], slow, seed=1) is None  # two imps tie every round: the full cycles


def test_unreadable_output_is_none():
    assert parse_output("", 2, 10) is None
    assert parse_output("Results: 1 2\n", 2, 10) is None
    assert parse_output("w0 by x scores 3\n  Results: 1 2 3 4\n", 3, 10) is None  # w1, w2 missing
    three = (
        "w0 by a scores 1\n  Results: 1 2 3 4\nw1 by b scores 1\n  Results: 0 1 2 7\n"
        "w2 by c scores 1\n  Results: 3 0 0 7\n"
    )
    r = parse_output(three, 3, 10)
    assert r == BattleResult(((1, 2, 3), (0, 1, 2), (3, 0, 0)), (4, 7, 7), 10)
    assert r.share(0) == pytest.approx(3 * (1 + 2 / 2 + 3 / 3) / 10)


@pytest.mark.slow  # a fresh interpreter as uid nobody: battles under their limits need no root
def test_as_an_ordinary_user(pmars, monkeypatch):
    from decentrain.testing import rerun_unprivileged

    monkeypatch.setenv("DECENTRAIN_PMARS", pmars)  # the same build, wherever this user's HOME is
    rerun_unprivileged(__file__, "not test_as_an_ordinary_user")
