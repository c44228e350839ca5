"""recipes -> algorithms -> core: core imports no algorithm, no family imports another,
nothing below the recipes imports decentrain/config.py (the composition root). The test kit
(decentrain/testing) sits beside the composition root: it may import any of the library, the
library imports none of it. Inside core, its own modules sit below core/comm, which sits below
core/launch; and no two packages import each other, even through other modules.

Checked on the transitive import graph, read statically from the sources: every import
in a module counts (also those inside functions, which run later but still tie the
layers), and importing `a.b.c` runs the package `__init__`s of `a` and `a.b` too.
A fresh interpreter per layer cross-checks the static graph against what Python really loads.
"""

import ast
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "decentrain"
SHARED = {"base", "pretraining", "outer"}  # what every algorithm family may use
ROOTS = {"decentrain.config", "decentrain.cli"}  # the composition root and the console script sit above the library
TESTING = "decentrain.testing"  # the test kit: support for tests, above the library like the roots


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}
FAMILIES = sorted(
    d.name for d in (PKG / "algorithms").iterdir() if d.is_dir() and d.name not in SHARED and not d.name.startswith("_")
)


def _parents(mod: str) -> list[str]:
    parts = mod.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(mod: str, tree: ast.AST) -> set[str]:
    """The module names `tree` (the source of `mod`) imports, relative imports resolved."""
    package = mod if MODULES[mod].name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            # from pkg import submodule
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "discover"
            and MODULES[mod].name == "__init__.py"
        ):  # core/registry.discover: the package imports each of its modules
            found |= {m for m in MODULES if m.rpartition(".")[0] == mod and not m.rpartition(".")[2].startswith("_")}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "discover_marked"
            and isinstance(node.args[2], ast.Tuple)
        ):  # core/registry.discover_marked: modules holding a marker
            markers = [c.value for c in node.args[2].elts if isinstance(c, ast.Constant)]
            found |= {
                m
                for m, p in MODULES.items()
                if any(k in p.read_text() for k in markers)
                and p != MODULES[mod]
                and not any(part.startswith("_") for part in m.split("."))
            }
    return found


def _direct(mod: str) -> set[str]:
    """Modules that importing `mod` (and calling its functions) imports, including parent packages."""
    found = set(_parents(mod)) | _imported(mod, ast.parse(MODULES[mod].read_text()))
    return {m for f in found for m in (f, *_parents(f)) if m in MODULES or m.split(".")[0] == "recipes"}


@cache
def closure(mod: str) -> frozenset[str]:
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        for d in _direct(m) if m in MODULES else ():
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return frozenset(seen - {mod})


def _under(mods, prefix: str) -> set[str]:
    return {m for m in mods if m == prefix or m.startswith(prefix + ".")}


def _family(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "algorithms" and parts[2] in FAMILIES else None


def test_the_static_graph_sees_the_imports():
    # the walker itself: direct, relative, `from pkg import submodule`, parent packages, transitive
    assert "decentrain.core.checkpoint" in closure("decentrain.algorithms.pretraining.trainer")
    assert "decentrain.algorithms" in closure("decentrain.algorithms.ddp.ddp")
    assert "decentrain.algorithms.base" in closure("decentrain.algorithms.ddp")
    assert "decentrain.core.registry" in closure("decentrain.algorithms.ddp.ddp")  # via base
    assert set(FAMILIES) >= {"ddp", "diloco", "noloco", "sapo", "hdee"}
    # a package that discovers its modules (core/registry.discover) imports every one of them
    assert "decentrain.algorithms.pretraining.transports.torchft_groups" in closure(
        "decentrain.algorithms.pretraining.run"
    )
    assert "decentrain.algorithms.sparseloco.sparseloco" in closure("decentrain.config")  # discover_marked


def _library() -> set[str]:
    return set(MODULES) - ROOTS - _under(MODULES, TESTING)


@pytest.mark.parametrize("mod", sorted(_library()))
def test_nothing_below_the_recipes_imports_the_composition_root(mod):
    bad = _under(closure(mod), "decentrain.config") | _under(closure(mod), "recipes")
    assert not bad, f"{mod} imports {sorted(bad)} (transitively)"


@pytest.mark.parametrize(
    "mod",
    sorted(
        m
        for m in MODULES
        if m.startswith(("decentrain.core", "decentrain.models", "decentrain.data", "decentrain.tasks"))
    ),
)
def test_core_models_data_tasks_import_no_algorithm(mod):
    bad = _under(closure(mod), "decentrain.algorithms")
    assert not bad, f"{mod} imports {sorted(bad)} (transitively)"


# core's rooms, lowest first: its own modules (world, stores, registry, checkpoints), core/comm (how
# workers talk: transports, membership, heal authority), core/launch (how they are started). A module
# imports its own room and those below it, never one above (core/comm and core/launch imported each other once).
CORE_ROOMS = ("decentrain.core", "decentrain.core.comm", "decentrain.core.launch")


def _core_room(mod: str) -> int:
    return max(i for i, room in enumerate(CORE_ROOMS) if mod == room or mod.startswith(room + "."))


def test_every_package_of_core_is_a_room():
    packages = {m for m in _under(MODULES, "decentrain.core") if MODULES[m].name == "__init__.py"}
    assert packages == set(CORE_ROOMS), "place a new package of core in CORE_ROOMS, above what it imports"


@pytest.mark.parametrize("mod", sorted(_under(MODULES, "decentrain.core")))
def test_core_imports_only_its_own_room_and_those_below(mod):
    bad = {m for m in _under(closure(mod), "decentrain.core") if _core_room(m) > _core_room(mod)}
    assert not bad, f"{mod} ({CORE_ROOMS[_core_room(mod)]}) imports {sorted(bad)} (transitively)"


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if m.startswith("decentrain.algorithms")))
def test_no_algorithm_family_imports_another(mod):
    own = _family(mod)
    bad = {m for m in closure(mod) if _family(m) not in (None, own)}
    assert not bad, f"{mod} ({own or 'shared'}) imports {sorted(bad)} (transitively)"


# A module whose optional extra is missing (hivemind for SAPO's DHT, deepspeed, ...) cannot be
# loaded in a `.[dev]`-only venv: it is reported as skipped, not failed; what it did load counts.
_PROBE = """
import importlib, json, sys
skipped = []
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("decentrain", "recipes"):
            raise
        skipped.append([m, e.name])
loaded = sorted(k for k in sys.modules if k.startswith(("decentrain", "recipes")))
print(json.dumps({"loaded": loaded, "skipped": skipped}))
"""

# makes the probe's interpreter behave as if hivemind were not installed
_NO_HIVEMIND = """
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hivemind":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Missing())
"""


def _layer_modules(layer: str) -> list[str]:
    prefix = "decentrain.core" if layer == "core" else f"decentrain.algorithms.{layer}"
    return sorted(_under(MODULES, prefix))


@pytest.mark.slow
def test_what_python_loads_matches_the_static_graph():
    """Import every module of a layer in a fresh interpreter (all layers at once) and check what came with it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    layers = ["core", "pretraining", "outer", *FAMILIES]
    procs = {
        layer: subprocess.Popen(
            [sys.executable, "-c", _PROBE, *_layer_modules(layer)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for layer in layers
    }
    try:
        results = {layer: (proc.communicate(timeout=300), proc.returncode) for layer, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()  # no-op for those that ended
    for layer, ((out, err), returncode) in results.items():
        assert returncode == 0, err[-2000:]
        loaded = set(json.loads(out.splitlines()[-1])["loaded"])
        assert not _under(loaded, "decentrain.config") | _under(loaded, "recipes"), (layer, sorted(loaded))
        if layer == "core":
            assert not _under(loaded, "decentrain.algorithms"), sorted(_under(loaded, "decentrain.algorithms"))
        own = None if layer in SHARED else layer
        assert not {m for m in loaded if _family(m) not in (None, own)}, (layer, sorted(loaded))
        mods = _layer_modules(layer)
        static = set(mods) | {m for mod in mods for m in closure(mod)}
        assert loaded <= static, f"the static graph missed {sorted(loaded - static)}"


def test_the_probe_skips_a_module_whose_extra_is_missing():
    """A `.[dev]`-only venv has no hivemind: SAPO's DHT guard is skipped there, its layer still checked."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    mods = ["decentrain.algorithms.sapo.dht_guard", "decentrain.core.config_checks"]
    run = subprocess.run(
        [sys.executable, "-c", _NO_HIVEMIND + _PROBE, *mods], env=env, text=True, capture_output=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert [m for m, _ in out["skipped"]] == ["decentrain.algorithms.sapo.dht_guard"]
    assert "decentrain.core.config_checks" in out["loaded"]


@pytest.mark.parametrize("mod", sorted(_library() | ROOTS))
def test_the_library_never_imports_the_test_kit(mod):
    bad = _under(closure(mod), TESTING)
    assert not bad, f"{mod} imports {sorted(bad)} (transitively)"


@pytest.mark.parametrize("mod", sorted(_under(MODULES, TESTING)))
def test_the_test_kit_imports_no_recipe(mod):
    bad = _under(closure(mod), "recipes")
    assert not bad, f"{mod} imports {sorted(bad)}: the kit runs recipes as a user does (python -m), from the checkout"


def test_library_never_imports_recipes():
    for mod, f in MODULES.items():
        if mod == "decentrain.cli":  # the console script is the recipe's launcher
            continue
        assert not _under(_direct(mod), "recipes"), f


def _runtime_imports(mod: str) -> set[str]:
    """The library modules `mod` imports when it runs: `_direct` without its parent packages and
    without imports under `if TYPE_CHECKING:` (annotations only, never executed)."""
    tree = ast.parse(MODULES[mod].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    return {f for f in _imported(mod, tree) if f in MODULES and f not in _parents(mod) and f != mod}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while (w := stack.pop()) != v:
                        on.discard(w)
                        comp.append(w)
                    on.discard(v)
                    if comp:
                        out.append(sorted([v, *comp]))
    return out


def test_no_import_cycles():
    # A cycle (e.g. sapo/generation <-> sapo/vllm_backend, once) makes import order matter and
    # forces imports into functions; the graph counts those function-level imports too.
    assert _cycles({m: _runtime_imports(m) for m in MODULES}) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def _package(mod: str) -> str:
    return mod if MODULES[mod].name == "__init__.py" else mod.rpartition(".")[0]


def _package_graph(imports: dict[str, set[str]], package: Callable[[str], str]) -> dict[str, set[str]]:
    """The modules' imports drawn between their packages. A package and the packages inside it are one
    room (pre-training and the engines and transports it picks from their registries): no edge between them."""
    graph: dict[str, set[str]] = {}
    for mod, deps in imports.items():
        p = package(mod)
        graph.setdefault(p, set())
        for q in map(package, deps):
            graph.setdefault(q, set())
            if not (q == p or q.startswith(p + ".") or p.startswith(q + ".")):
                graph[p].add(q)
    return graph


def test_no_import_cycles_between_packages():
    # Modules can be acyclic while their packages are not (core/comm/membership -> core/launch/incarnation and
    # core/launch/launcher -> core/comm/job_store, once): then neither package can be read, moved or tested
    # without the other.
    graph = _package_graph({m: _runtime_imports(m) for m in MODULES}, _package)
    assert _cycles(graph) == []

    def parent(mod: str) -> str:
        return mod.rpartition(".")[0]

    assert _cycles(_package_graph({"p.a.x": {"p.b.y"}, "p.b.y": {"p.a.z"}, "p.a.z": set()}, parent)) == [["p.a", "p.b"]]
    assert _cycles(_package_graph({"p.x": {"p.a.y"}, "p.a.y": {"p.z"}, "p.z": set()}, parent)) == []  # one room
