"""sapo/__init__.py's index names every module of the package, and only those (issue 43: it listed 9 of its
18 modules, and `identity`, which had moved to core)."""

import re
from pathlib import Path

import decentrain.algorithms.sapo as sapo


def test_the_package_index_names_every_module_and_only_those():
    root = Path(sapo.__file__).parent
    modules = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    packages = {f"{p.parent.name}/" for p in root.glob("*/__init__.py")}
    listed = re.findall(r"^  (\S+) ", sapo.__doc__, re.M)  # "  name  what it holds"; wrapped lines indent deeper
    assert len(listed) == len(set(listed))
    assert set(listed) == modules | packages
