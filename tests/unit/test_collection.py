"""Every test tier is collected by the README's `python -m pytest -q` and selectable by its marker.

pytest's default `norecursedirs` holds "dist", so tests/dist once contributed nothing to CI
without anyone noticing. Collecting the whole real suite costs ~30 s of imports, so this runs
pytest on a mirror: the repository's pytest settings and tests/conftest.py, and one trivial
test file in a folder named like each real tier that has test files.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TIERS = sorted(d.name for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py")))


# one interpreter for every selection: the conftest's imports (torch) are paid once
_COLLECT = """
import contextlib, io, json, sys
import pytest
out = {}
for selection in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *selection])
    out[" ".join(selection)] = [int(code), [line for line in buf.getvalue().splitlines() if "::" in line]]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> dict[str, list[str]]:
    """Selection ("" = the default run, "-m <tier>") -> the test ids collected from the mirror."""
    tree = tmp_path_factory.mktemp("mirror")
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    (tree / "tests").mkdir()
    shutil.copy(TESTS / "conftest.py", tree / "tests" / "conftest.py")
    for tier in TIERS:
        (tree / "tests" / tier).mkdir()
        (tree / "tests" / tier / f"test_probe_{tier}.py").write_text("def test_probe():\n    pass\n")
    selections = [[]] + [["-m", tier] for tier in TIERS]
    run = subprocess.run(
        [sys.executable, "-c", _COLLECT, json.dumps(selections)], cwd=tree, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.splitlines()[-1])
    for name, (code, _) in result.items():
        assert code in (0, 5), f"collecting {name!r} failed with exit code {code}"  # 5: nothing collected
    return {name: ids for name, (_, ids) in result.items()}


def test_the_real_tiers_are_known():
    assert {"unit", "dist", "integration", "gpu"} <= set(TIERS)


def test_every_tier_contributes_to_the_default_run(collected):
    missing = [t for t in TIERS if not any(c.startswith(f"tests/{t}/") for c in collected[""])]
    assert not missing, f"`python -m pytest -q` collects nothing from tests/{missing} (norecursedirs?)"


@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_is_selected_by_its_marker(collected, tier):
    assert collected[f"-m {tier}"] == [f"tests/{tier}/test_probe_{tier}.py::test_probe"]
