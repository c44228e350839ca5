"""The one way to pick a component: a name -> entry registry, and the section typed by its entry's own config.

Every pluggable part (an algorithm, an engine, a transport, an outer optimizer, an exchange, a launcher,
a reward, a model family, ...) is an entry of a `Registry`, filled by the `register` decorator beside
the entry's code; a config picks it by its section's `name`. A registry whose entries have fields of their
own carries the config class they all extend (`Registry(section, config=BaseConfig)`), each entry its own
class (`register(name, config=...)` or a `config_cls` attribute), and `Registry.config` types a section
by the class of the entry it names: no flat union of every entry's keys.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from decentrain.core.typed import check_known, typed

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a config's `name` to a component (prime-rl style, no import strings).

    `kind`: what the entries are, and for a registry with `config` the section whose `name` picks one
    (`"engine"`): error messages name fields under it. `config`: the config class every entry's own class
    extends (None: the entries take no config section of their own).
    """

    def __init__(self, kind: str, config: type | None = None):
        self.kind = kind
        self.base = config
        self._entries: dict[str, T] = {}

    def register(self, name: str, config: type | None = None) -> Callable[[T], T]:
        """Decorator adding an entry under `name`; `config`, its own config class, becomes its `config_cls`
        (without one it keeps the `config_cls` it declares or inherits)."""

        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            if config is not None:
                obj.config_cls = config  # type: ignore[attr-defined]
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

    def config_cls(self, name: str | None, where: str | None = None) -> type:
        """The config class of entry `name` (None: the registry's base class); `where`: the section's place."""
        if name is None:
            return self.base
        return self.get(name, field=f"{where or self.kind}.name").config_cls

    def configs(self) -> dict[str, type]:
        """Each entry's config class, by name: the schemas Hydra's conf/<section>/<name>.yaml extend."""
        return {name: self.config_cls(name) for name in self.names()}

    def config(self, raw: Any, where: str | None = None, default_name: str | None = None, fill: Any = None) -> Any:
        """The section `raw` typed by the config class of the entry it names.

        `raw`: a plain mapping (Hydra's), None (empty), or a config instance, kept when it names its entry and
        is of that entry's own class, otherwise re-typed from its fields (a default of the base class naming an
        entry with fields of its own). A section without a name (or `name: null`) picks `default_name`,
        else the base class's default name; with neither it stays the base class. `fill`: a config whose
        fields fill those `raw` leaves out, where the entry's class has them (the outer optimizer takes its
        algorithm's η and μ); without it they take the class's defaults. `where`: the section's place in the
        whole config (`job.algorithm` for HDEE's jobs); entries name their fields under `kind`, and errors
        are relabelled to `where`. Unknown keys and bad values fail in one line naming the field.
        """
        if self.base is None:
            raise TypeError(f"the {self.kind} registry has no config class (Registry(kind, config=...))")
        where = where or self.kind
        if isinstance(raw, self.base):
            if raw.name is not None and type(raw) is self.config_cls(raw.name, where):
                return raw
            raw = dataclasses.asdict(raw)
        raw = {k: v for k, v in dict(raw or {}).items() if not (k == "name" and v is None)}
        name = raw.get("name", self._default_name(default_name))
        cls = self.config_cls(name, where)
        check_known(cls, raw, where)  # outside the relabelling: it names `where` itself
        start = (
            {f.name: getattr(fill, f.name) for f in dataclasses.fields(cls) if hasattr(fill, f.name)}
            if fill is not None
            else {}
        )
        try:
            return typed(cls, {**start, **raw, "name": name}, where)
        except ValueError as e:
            raise ValueError(self._relabel(str(e), where)) from None

    def _default_name(self, default_name: str | None) -> str | None:
        if default_name is not None:
            return default_name
        return next((f.default for f in dataclasses.fields(self.base) if f.name == "name"), None)

    def _relabel(self, msg: str, where: str) -> str:
        """`msg` naming its field under `where`: entries' checks name theirs under `kind` (`algorithm.lr`)."""
        if msg.startswith(where):
            return msg
        return where + msg[len(self.kind) :] if msg.startswith(self.kind) else f"{where}: {msg}"


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
