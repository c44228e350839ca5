"""The one conversion from a plain dict (Hydra's resolved config) to the typed dataclasses.

Every recipe converts once, with `typed(schema, raw)`. A section picked from a registry by
its `name` (an algorithm, an engine, a transport, an outer optimizer) has no flat union of
every entry's fields: its default's class offers `convert(raw, where, default)`, which types
the section with the entry's own config class. Other sections are typed field by field by
OmegaConf. Unknown keys and bad values fail in one line naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, TypeVar

from omegaconf import OmegaConf

T = TypeVar("T")


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def renamed_key(cls: type, keys: Iterable[str], where: str) -> str | None:
    """The one-line error for the first of `keys` that `cls` renamed or moved, or None.

    `cls.RENAMED`: old -> new, both relative to the section at `where`; `cls.MOVED`: old -> where the
    setting lives now, written from the top of the config (it went to another section)."""
    renamed, moved = getattr(cls, "RENAMED", {}), getattr(cls, "MOVED", {})
    gone = sorted(set(keys) & (set(renamed) | set(moved)))
    if not gone:
        return None
    prefix = f"{where}." if where else ""
    return f"{prefix}{gone[0]} was removed; use {moved.get(gone[0]) or prefix + renamed[gone[0]]}"


def check_known(cls: type, raw: Mapping[str, Any], where: str) -> None:
    """Unknown keys fail naming the section; a renamed key fails naming the new one."""
    gone = renamed_key(cls, raw, where)
    if gone:
        raise ValueError(gone)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where or 'config'}: unknown field(s) {unknown}; allowed: {sorted(known)}")


def typed(cls: type[T], raw: Mapping[str, Any], where: str = "") -> T:
    """`cls` built from `raw` (its `__post_init__` checks run); `where` is the section's dotted place."""
    check_known(cls, raw, where)
    node = OmegaConf.structured(cls)
    plain: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        value, default = raw[f.name], _default(f)
        path = f"{where}.{f.name}" if where else f.name
        if isinstance(value, Mapping) and dataclasses.is_dataclass(default):
            convert = getattr(type(default), "convert", None)  # a registry-picked section
            sub = convert(value, path, default) if convert else typed(type(default), value, path)
            node[f.name] = OmegaConf.structured(sub)  # assigned, not merged: the entry's class may differ
        else:
            plain[f.name] = value
    return OmegaConf.to_object(OmegaConf.merge(node, plain))
