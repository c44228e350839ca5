"""recipes -> algorithms -> core: core imports no algorithm, no family imports another."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "decentrain"
SHARED = {"base", "common"}  # what every algorithm family may use


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(sub: str):
    return sorted((PKG / sub).rglob("*.py"))


def test_core_models_data_import_no_algorithm_or_recipe():
    for sub in ("core", "models", "data"):
        for f in _modules(sub):
            bad = {m for m in _imports(f) if m.startswith(("decentrain.algorithms", "recipes", "decentrain.config"))}
            assert not bad, f"{f.relative_to(PKG)} imports {bad}"


def test_no_algorithm_family_imports_another():
    families = [d.name for d in (PKG / "algorithms").iterdir() if d.is_dir() and d.name not in SHARED and not d.name.startswith("_")]
    assert "ddp" in families
    for fam in families + sorted(SHARED - {"base"}):
        for f in _modules(f"algorithms/{fam}"):
            for m in _imports(f):
                parts = m.split(".")
                if parts[:2] == ["decentrain", "algorithms"] and len(parts) > 2:
                    assert parts[2] in SHARED | {fam}, f"{f.relative_to(PKG)} imports {m}"


def test_library_never_imports_recipes():
    for f in PKG.rglob("*.py"):
        if f.name == "cli.py":  # the console script is the recipe's launcher
            continue
        assert not {m for m in _imports(f) if m.startswith("recipes")}, f
