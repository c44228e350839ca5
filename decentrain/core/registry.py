"""A tiny name -> class registry, so configs pick components by a `name` field."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Callable, Generic, Iterable, Sequence, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a config's `name` to a component class (prime-rl style, no import strings)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str, field: str | None = None) -> T:
        if name not in self._entries:
            where = field or f"{self.kind}.name"
            raise ValueError(f"{where}={name!r} is unknown; allowed: {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries


def discover(package: str, path: Iterable[str]) -> list[str]:
    """Import every module of `package` (its `__name__` and `__path__`), so that each registers itself.

    The names come from the package's own directory listing (pkgutil), never from a config or
    a peer: adding an entry is adding a module, with no import list to edit. Modules whose name
    starts with `_` are helpers, not entries. Returns the modules imported, sorted.
    """
    names = sorted(info.name for info in pkgutil.iter_modules(list(path)) if not info.name.startswith("_"))
    return _import_all(package, names)


def discover_marked(package: str, root: str | Path, markers: Sequence[str]) -> list[str]:
    """Import every module under `root` (the directory of `package`, subpackages included) whose source
    holds one of `markers` (e.g. a registration decorator), so that registries fill without an import list.

    The names come from the package's own files; the source is only searched for the marker text.
    Files and folders whose name starts with `_` are skipped. Returns the modules imported (dotted,
    relative to `package`), sorted.
    """
    root, names = Path(root), []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if not any(p.startswith("_") for p in parts) and any(m in path.read_text(encoding="utf-8") for m in markers):
            names.append(".".join(parts))
    return _import_all(package, names)


def _import_all(package: str, names: list[str]) -> list[str]:
    for name in names:
        importlib.import_module(f"{package}.{name}")  # a file of this package (see the callers' docstrings)
    return names
