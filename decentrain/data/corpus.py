"""The offline multi-domain corpus: text that every Debian + CPython machine already has.

Its text depends on the machine: which Python, which Debian packages are installed (one more package
changes the licenses, changelogs and general domains), so the same config gives other blocks on
another box. It is the quick default for tests and laptops; results say "offline, machine-dependent".
Evidence trains on the pinned corpus (`data=pinned`, `decentrain data prepare`), named by its hash.

Domains (each a list of documents, read in a fixed order):
  python_stdlib  CPython's standard library sources (Lib/*.py, tests excluded)
  python_tests   CPython's own test suite (Lib/test/**/*.py)
  python_docs    the Python reference's topic pages (`pydoc_data.topics`)
  c_headers      C headers under /usr/include
  licenses       license texts: /usr/share/common-licenses and packages' copyright files
  changelogs     Debian package changelogs (/usr/share/doc/*/changelog.Debian.gz)
  general        packages' prose documentation: README, NEWS, TODO, AUTHORS under /usr/share/doc
                 (no changelog or copyright file: disjoint from changelogs and licenses); HDEE's
                 general-text seed domain
  arithmetic     reasoning-gym problems with their answers (generated, seeded)
"""

from __future__ import annotations

import gzip
import hashlib
import sysconfig
from pathlib import Path
from typing import Callable

from decentrain.core.registry import Registry

Documents = list[str]
DOMAINS: Registry[Callable[[int, int], Documents]] = Registry("data.domains")


def _read_files(paths: list[Path], max_bytes: int, seed: int, opener=open) -> Documents:
    """Read files in a seeded, machine-independent order until `max_bytes` of text."""
    order = sorted(paths, key=lambda p: hashlib.sha1(f"{seed}:{p.name}:{p}".encode()).hexdigest())
    docs, total = [], 0
    for p in order:
        try:
            with opener(p, "rt", encoding="utf-8", errors="replace") as f:
                text = f.read(max_bytes)
        except OSError:
            continue
        if text.strip():
            docs.append(text)
            total += len(text)
        if total >= max_bytes:
            break
    return docs


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@DOMAINS.register("python_stdlib")
def python_stdlib(max_bytes: int, seed: int) -> Documents:
    root = _stdlib()
    skip = ("test", "site-packages", "idlelib", "lib2to3", "tkinter")
    files = [p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts)]
    return _read_files(files, max_bytes, seed)


@DOMAINS.register("python_tests")
def python_tests(max_bytes: int, seed: int) -> Documents:
    return _read_files(list((_stdlib() / "test").rglob("*.py")), max_bytes, seed)


@DOMAINS.register("python_docs")
def python_docs(max_bytes: int, seed: int) -> Documents:
    from pydoc_data.topics import topics

    docs, total = [], 0
    for name in sorted(topics, key=lambda n: hashlib.sha1(f"{seed}:{n}".encode()).hexdigest()):
        docs.append(topics[name])
        total += len(topics[name])
        if total >= max_bytes:
            break
    return docs


@DOMAINS.register("c_headers")
def c_headers(max_bytes: int, seed: int) -> Documents:
    return _read_files(list(Path("/usr/include").rglob("*.h")), max_bytes, seed)


@DOMAINS.register("licenses")
def licenses(max_bytes: int, seed: int) -> Documents:
    files = [p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file()]
    files += list(Path("/usr/share/doc").glob("*/copyright"))
    return _read_files(files, max_bytes, seed)


@DOMAINS.register("changelogs")
def changelogs(max_bytes: int, seed: int) -> Documents:
    return _read_files(list(Path("/usr/share/doc").glob("*/changelog.Debian.gz")), max_bytes, seed, opener=gzip.open)


@DOMAINS.register("general")
def general(max_bytes: int, seed: int) -> Documents:
    # Prose, not code or legal text: the general-text split an HDEE seed trains on, disjoint from
    # every other domain's files (changelog.Debian and copyright files belong to their own domains).
    prose = ("README", "NEWS", "TODO", "AUTHORS")
    files = [
        p
        for p in Path("/usr/share/doc").glob("*/*")
        if p.is_file()
        and p.name.split(".")[0] in prose
        and not p.name.startswith(("NEWS.Debian", "README.Debian"))
        and ".htm" not in p.name
    ]
    plain = [p for p in files if p.suffix != ".gz"]
    docs = _read_files(plain, max_bytes, seed)
    got = sum(map(len, docs))
    if got < max_bytes:
        docs += _read_files([p for p in files if p.suffix == ".gz"], max_bytes - got, seed, opener=gzip.open)
    return docs


@DOMAINS.register("arithmetic")
def arithmetic(max_bytes: int, seed: int) -> Documents:
    import reasoning_gym

    docs, total = [], 0
    for name in ("basic_arithmetic", "chain_sum", "leg_counting"):
        for item in reasoning_gym.create_dataset(name, size=max(1, max_bytes // 300), seed=seed):
            doc = f"Q: {item['question']}\nA: {item['answer']}\n"
            docs.append(doc)
            total += len(doc)
            if total >= max_bytes:
                return docs
    return docs


def load_domain(name: str, max_bytes: int, seed: int) -> Documents:
    docs = DOMAINS.get(name, field="data.domains")(max_bytes, seed)
    if not docs:
        raise ValueError(
            f"data.domains: domain {name!r} has no text on this machine; pick others from {DOMAINS.names()}"
        )
    return docs
