"""decentrain.testing, the shared test kit: tests import it one way, its helpers exist once, and
the helpers themselves fail where a test relies on them to fail."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from decentrain.testing import free_port, run_in_threads

TESTS = Path(__file__).resolve().parents[1]
OLD_HELPERS = {
    "dist_helpers",
    "recipe_helpers",
    "ft_helpers",
    "slurm_helpers",
    "sapo_helpers",
    "hdee_helpers",
    "trainer_helpers",
    "device_guard",
    "privilege",
}
KIT = {"free_port", "run_ranks", "run_in_threads", "run_in_fresh_process", "run_recipe", "lighthouse", "average"}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != "conftest.py")


def test_tests_import_the_kit_one_way():
    """`from decentrain.testing import ...`; not the old tests/ helper modules, not `tests.` paths."""
    bad = []
    for path in _test_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                top = node.module.split(".")[0]
                if top in OLD_HELPERS or top == "tests":
                    bad.append(f"{path.relative_to(TESTS)}:{node.lineno} from {node.module}")
            elif isinstance(node, ast.Import):
                bad += [
                    f"{path.relative_to(TESTS)}:{node.lineno} import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] in OLD_HELPERS | {"tests"}
                ]
    assert not bad, "import the test kit as `from decentrain.testing import ...`:\n" + "\n".join(bad)


def test_no_test_file_defines_a_kit_helper_again():
    twice = [
        f"{p.relative_to(TESTS)}: def {node.name}"
        for p in _test_files()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in KIT
    ]
    assert not twice, "these live in decentrain.testing:\n" + "\n".join(twice)


def test_the_kit_loads_lazily():
    """`free_port` alone brings no torchft, hivemind or SAPO stack with it."""
    code = (
        "import sys; from decentrain.testing import free_port; free_port(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torchft', 'hivemind', 'reasoning_gym')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    with pytest.raises(ImportError):
        exec("from decentrain.testing import no_such_helper")


def test_free_port_is_bindable():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


def test_run_in_threads_returns_in_rank_order_and_fails_on_a_stuck_rank():
    assert run_in_threads(lambda r: r * 10, 3) == [0, 10, 20]
    release = threading.Event()
    try:
        with pytest.raises(AssertionError, match=r"still running after .* \[1\]"):
            run_in_threads(lambda r: release.wait(60) if r == 1 else r, 2, timeout=0.5)
    finally:
        release.set()
    with pytest.raises(AssertionError, match="ranks that raised"):
        run_in_threads(lambda r: 1 / r, 2)


def test_every_exported_name_resolves_to_what_its_module_defines():
    """A name equal to a submodule's would resolve to the module once that submodule is imported."""
    import importlib
    import pkgutil

    import decentrain.testing as kit

    submodules = {m.name for m in pkgutil.iter_modules(kit.__path__)}
    assert not submodules & set(kit.__all__), "rename the module: its name shadows an exported name"
    for name in kit.__all__:
        if name in {"LocalSlurm", "missing_requirements", "WarriorEndpoint", "pmars_or_skip"}:
            continue  # optional stacks (Slurm, pMARS) are imported by their own tests
        module = importlib.import_module(f"decentrain.testing.{kit._WHERE[name]}")
        assert getattr(kit, name) is getattr(module, name), name
