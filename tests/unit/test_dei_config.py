"""A DEI config is refused before any node starts, in one line naming the field, when no run of it
could work: past pMARS's 36 warriors, a named pMARS that is missing or is not pMARS, limits no
battle fits in, unbounded values, a run dir that cannot be one, an endpoint that is not a URL.
And `summarize` reads what nodes wrote as data: it caps and checks entries and writes only
finite numbers.

On main at 78c329b every value below was accepted (rounds=40 crashed in round 34 with every
archive unsaved; /bin/true ran a whole search with no elites; /nonexistent fell back to another
pMARS; seed=-1, threads=-2, a file as run_dir and base_url=notaurl were tracebacks in each node),
and summarize wrote `Infinity` into summary.json or raised on a malformed entry. Runs as root
and, re-run by `test_as_an_ordinary_user`, as uid nobody.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import recipes.dei
from decentrain.algorithms.dei.config import DEIConfig, SearchConfig
from decentrain.algorithms.dei.pmars import PMarsConfig, PMarsUnavailable, find_pmars
from decentrain.testing import ROOT, WarriorEndpoint, pmars_or_skip, recipe_command, recipe_env, rerun_unprivileged

CONF = Path(__file__).resolve().parents[2] / "conf"


def _config(tmp_path, *overrides: str) -> DEIConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        dcfg = compose(config_name="dei", overrides=[f"run_dir={tmp_path}", *overrides])
    return recipes.dei.to_config(dcfg)


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory")
    return path


REFUSED = [
    ("search.rounds=40", "search.rounds=40"),  # 1 + 2 initial + 39 champions > 36
    (
        "search.initial_opponents=[imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,"
        "dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp,dwarf,imp]",
        "search.rounds=3",
    ),
    ("search.axes=[uo,uo]", "search.axes"),
    ("search.iters=1000000000", "search.iters"),
    (("pmars.core_size=1000000000", "redcode.core_size=1000000000"), "core_size=1000000000"),
    ("pmars.cycles=1000000000000", "pmars.cycles"),
    ("pmars.memory_mb=1000000000000", "pmars.memory_mb"),
    ("pmars.rounds=1000000000", "pmars.rounds"),
    ("pmars.max_length=100000", "pmars.max_length"),
    ("pmars.timeout_s=1e9", "pmars.timeout_s"),
    ("share.max_chars=1000000000000", "share.max_chars"),
    ("share.elites=1000000", "share.elites"),
    ("seed=-1", "seed"),
    ("threads=-2", "threads"),
    ("threads=0", "threads"),
    ("operator.base_url=notaurl", "operator.base_url"),
    ("operator.base_url=ftp://127.0.0.1/v1", "operator.base_url"),
    ("operator.base_url='http://user:secret@127.0.0.1/v1'", "operator.base_url must not hold credentials"),
    ("operator.base_url='http://127.0.0.1:99999/v1'", "operator.base_url"),
    ("operator.base_url='http://127.0.0.1/v1 x'", "operator.base_url"),
    ("operator.timeout_s=1e12", "operator.timeout_s"),
]


@pytest.mark.parametrize("override,field", REFUSED)
def test_a_value_no_run_could_use_is_refused_in_one_line(override, field, tmp_path):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")) as refused:
        _config(tmp_path, *(override if isinstance(override, tuple) else [override]))
    assert "\n" not in str(refused.value)


def test_a_file_on_the_run_dirs_way_is_refused(tmp_path, a_file):
    for run_dir in (a_file, a_file / "sub"):
        with pytest.raises(ValueError, match=f"run_dir={run_dir}: {a_file} is not a directory"):
            DEIConfig(run_dir=str(run_dir))


def test_rounds_past_the_battle_limit_are_fine_with_last_k_opps(tmp_path):
    cfg = _config(tmp_path, "search.rounds=40", "search.last_k_opps=33")
    assert cfg.search.battle_size == 36
    with pytest.raises(ValueError, match="search.rounds=40"):
        SearchConfig(rounds=40, last_k_opps=34)


def test_a_named_pmars_that_is_missing_is_an_error_never_a_fallback(monkeypatch, tmp_path):
    with pytest.raises(PMarsUnavailable, match="pmars.binary=/nonexistent/pmars is not an executable file"):
        find_pmars(PMarsConfig(binary="/nonexistent/pmars"))
    monkeypatch.setenv("DECENTRAIN_PMARS", str(tmp_path / "missing"))
    with pytest.raises(PMarsUnavailable, match=r"\$DECENTRAIN_PMARS=.*missing is not an executable file"):
        find_pmars(PMarsConfig())


def test_limits_no_battle_fits_in_fail_the_probe_before_start(tmp_path):
    from decentrain.algorithms.dei.run import preflight

    pmars_or_skip()
    preflight(_config(tmp_path, "operator.name=openai"), tmp_path)  # the shipped limits pass
    cfg = _config(tmp_path, "operator.name=openai", "pmars.memory_mb=1")
    with pytest.raises(PMarsUnavailable, match=r"probe battle of 5 warriors .* pmars.memory_mb=1") as refused:
        preflight(cfg, tmp_path)
    assert "\n" not in str(refused.value)


def test_a_pmars_that_is_not_pmars_stops_the_recipe_before_any_node_starts(tmp_path):
    endpoint = WarriorEndpoint()
    try:
        cmd = recipe_command(
            "recipes.dei",
            "num_nodes=2",
            "operator.name=openai",
            f"nodes=[{{base_url: '{endpoint.url(0)}'}},{{base_url: '{endpoint.url(1)}'}}]",
            "search.rounds=1",
            "search.n_init=1",
            "search.iters=1",
            "pmars.binary=/bin/true",
            f"run_dir={tmp_path}",
        )
        proc = subprocess.run(cmd, cwd=ROOT, env=recipe_env(), capture_output=True, text=True, timeout=540)
    finally:
        endpoint.close()
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("config error: pmars: a probe battle of 3 warriors in /bin/true failed"), lines[-5:]
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("node*")) and endpoint.calls == {}  # no node started, no model called


def test_a_run_dir_this_user_cannot_write_is_refused_before_start(tmp_path):
    from decentrain.algorithms.dei.run import preflight

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        probe = locked / "probe"
        probe.mkdir()  # root writes anywhere: only an ordinary user can see this refusal
        probe.rmdir()
        pytest.skip("this user writes into a 0500 directory (root)")
    except PermissionError:
        pass
    with pytest.raises(ValueError, match=f"run_dir={locked / 'run'}: Permission denied"):
        preflight(_config(tmp_path, "operator.name=openai"), locked / "run")


# -- summarize -----------------------------------------------------------------------------------


def _write_node(run_dir: Path, node: int, archive: str, metrics: str = '{"round": 0, "elites": 1}\n') -> None:
    (run_dir / f"node{node}").mkdir(parents=True, exist_ok=True)
    (run_dir / f"node{node}" / "archive.json").write_text(archive)
    (run_dir / f"node{node}" / "metrics.jsonl").write_text(metrics)


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} in summary.json")

    return json.loads(text, parse_constant=refuse)


# an elite whose text does not parse: summarize re-battles nothing, so these need no pMARS
UNPARSABLE = "not redcode"


def test_summarize_never_writes_a_non_finite_number(tmp_path):
    from decentrain.algorithms.dei.run import summarize

    cfg = DEIConfig(num_nodes=2, search=SearchConfig(rounds=1), run_dir=str(tmp_path))
    _write_node(
        tmp_path,
        0,
        json.dumps({"rounds": [[{"text": UNPARSABLE, "fitness": 1.5, "cell": [1, 2]}]]}),
        '{"round": 0, "best_fitness": 1.5}\n',
    )
    _write_node(
        tmp_path,
        1,
        json.dumps({"rounds": [[{"text": UNPARSABLE, "fitness": float("inf"), "cell": [0, 0]}]]}),
        '{"round": 0, "best_fitness": Infinity}\n',
    )
    summary = summarize(cfg, tmp_path)
    assert _strict((tmp_path / "summary.json").read_text()) == summary
    assert summary["merged_own_fitness"] == {"qd_score": 1.5, "coverage": 1 / 36, "cells": 1}
    assert summary["nodes"] == {"node0": {"round": 0, "best_fitness": 1.5}}


def test_summarize_skips_and_counts_malformed_entries(tmp_path):
    from decentrain.algorithms.dei.run import summarize

    cfg = DEIConfig(num_nodes=4, search=SearchConfig(rounds=1), run_dir=str(tmp_path))
    good = {"text": UNPARSABLE, "fitness": 1.5, "cell": [1, 2]}
    bad = [
        {"text": UNPARSABLE, "fitness": float("inf"), "cell": [0, 0]},
        {"text": UNPARSABLE, "fitness": float("nan"), "cell": [0, 1]},
        {"text": UNPARSABLE, "fitness": 10**400, "cell": [0, 2]},
        {"text": 5, "fitness": 1.0, "cell": [0, 3]},
        {"text": UNPARSABLE, "fitness": 1.0, "cell": [99, 0]},
        {"text": UNPARSABLE, "fitness": 1.0},
        "an elite",
        None,
    ]
    _write_node(
        tmp_path,
        0,
        json.dumps({"rounds": [[good, *bad]]}),
        '{"round": 0, "best_fitness": 1.5}\n{"round": 0, "best_fitness": NaN}\n[1]\n',
    )
    _write_node(tmp_path, 1, json.dumps({"rounds": "every one"}), '{"round": "zero"}\n')
    _write_node(tmp_path, 2, "[" * 32_000, '{"round": 0, "best_fitness": 1e999}\n')
    _write_node(tmp_path, 5, json.dumps({"rounds": [[good]]}))  # no such node in a 4-node run
    summary = summarize(cfg, tmp_path)
    assert _strict((tmp_path / "summary.json").read_text()) == summary
    assert summary["merged_own_fitness"] == {"qd_score": 1.5, "coverage": 1 / 36, "cells": 1}
    assert summary["nodes"] == {"node0": {"round": 0, "best_fitness": 1.5}}
    assert summary["dropped"] == {"bad_elite": 8, "bad_archive": 2, "bad_metrics_row": 4, "elite_not_evaluated": 1}


def test_summarize_caps_entries_before_reading_them(tmp_path):
    from decentrain.algorithms.dei.run import summarize

    cfg = DEIConfig(num_nodes=2, search=SearchConfig(rounds=1), run_dir=str(tmp_path))
    elites = [{"text": UNPARSABLE, "fitness": 1.0, "cell": [i % 6, (i // 6) % 6]} for i in range(1000)]
    _write_node(tmp_path, 0, json.dumps({"rounds": [elites]}))
    _write_node(tmp_path, 1, "{}")
    with open(tmp_path / "node1" / "archive.json", "r+b") as f:
        f.truncate(65 << 20)  # past MAX_ARCHIVE_BYTES: refused on its size (a sparse file: nothing to read)
    with open(tmp_path / "node1" / "metrics.jsonl", "r+b") as f:
        f.truncate(17 << 20)
    summary = summarize(cfg, tmp_path)
    assert summary["dropped"] == {
        "too_many_elites": 1000 - 36,
        "bad_archive": 1,
        "metrics_too_large": 1,
        "elite_not_evaluated": 36,
    }
    assert summary["merged_own_fitness"]["cells"] == 36 and summary["nodes_reporting"] == 1


def test_as_an_ordinary_user(monkeypatch):
    selector = "no_run_could_use or file_on_the_run or named_pmars or summarize or cannot_write"
    try:
        monkeypatch.setenv("DECENTRAIN_PMARS", find_pmars(PMarsConfig()))
        selector += " or probe_before_start"
    except PMarsUnavailable:  # no pMARS here: the rest still runs as nobody
        pass
    rerun_unprivileged(__file__, selector)
