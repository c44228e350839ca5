"""Reading the pinned corpus: its manifest, its hash, and token blocks memory-mapped from its shards.

A prepared corpus is a directory: `manifest.json` plus flat uint8 shards `<domain>/<split>.<k>.bin`, the
UTF-8 text of the documents each followed by a NUL byte (nanoGPT's and llm.c's layout: the OS pages
in what a step reads, so a worker never holds the corpus in memory). For the byte-level tokenizer a
block is the shard's bytes mapped to token ids; any other tokenizer reads the documents and packs them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import torch

from decentrain.data.sources import sha256_file

MANIFEST = "manifest.json"
FORMAT = 1


class CorpusError(RuntimeError):
    """A pinned corpus that is missing, altered or incomplete; the message is one line that names the part."""


def default_dir() -> Path:
    return Path(os.environ.get("DECENTRAIN_DATA", Path.home() / ".cache" / "decentrain" / "pinned"))


def corpus_hash(shards: list[dict]) -> str:
    """The corpus's identity: sha256 over its shards' paths and digests (not times, not machines)."""
    lines = sorted(f"{s['path']} {s['sha256']}" for s in shards)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def resolve_dir(path: str | Path | None) -> Path:
    """A corpus directory; a `.tar.xz` pack is unpacked once beside itself (`<pack>.d/`) and read from there."""
    p = Path(path).expanduser() if path else default_dir()
    if p.name.endswith(".tar.xz"):
        out = p.with_name(p.name + ".d")
        if not (out / MANIFEST).exists():
            unpack(p, out)
        return out
    return p


def load_manifest(root: Path) -> dict:
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise CorpusError(
            f"no pinned corpus at {root} (no {MANIFEST}): build it with `decentrain data prepare "
            f"--out {root}`, or unpack a pack there"
        ) from None
    except (OSError, ValueError) as e:
        raise CorpusError(f"{root / MANIFEST} is unreadable: {e}") from None
    if manifest.get("format") != FORMAT:
        raise CorpusError(f"{root / MANIFEST} has format {manifest.get('format')!r}; this decentrain reads {FORMAT}")
    return manifest


def verify(root: Path, full: bool = True) -> dict:
    """Check every shard against the manifest (size always, sha256 when `full`) and the corpus hash."""
    manifest = load_manifest(root)
    for shard in manifest["shards"]:
        path = root / shard["path"]
        if not path.is_file():
            raise CorpusError(f"shard {shard['path']} is missing from {root}")
        if path.stat().st_size != shard["bytes"]:
            raise CorpusError(
                f"shard {shard['path']} has {path.stat().st_size} bytes, the manifest says {shard['bytes']}"
            )
        if full and sha256_file(path) != shard["sha256"]:
            raise CorpusError(f"shard {shard['path']}: sha256 differs from the manifest (altered or corrupt)")
    if corpus_hash(manifest["shards"]) != manifest["corpus_hash"]:
        raise CorpusError(f"{root / MANIFEST}: the corpus hash does not match its shard list")
    return manifest


def unpack(archive: Path, out: Path) -> Path:
    """Extract a pack (`decentrain data pack`) into `out` and verify it; a half-written `out` never stays."""
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(tmp, filter="data")  # "data": no absolute paths, links out of tmp or devices
    verify(tmp)
    os.replace(tmp, out)
    return out


def shard_streams(root: Path, manifest: dict, domain: str, split: str) -> list[np.ndarray]:
    shards = [s for s in manifest["shards"] if s["domain"] == domain and s["split"] == split]
    if not shards:
        raise CorpusError(
            f"the pinned corpus at {root} has no {split} text for domain {domain!r}; "
            f"it has {sorted(manifest['domains'])}"
        )
    return [np.memmap(root / s["path"], dtype=np.uint8, mode="r") for s in sorted(shards, key=lambda s: s["path"])]


class MappedBlocks:
    """[n, seq_len] token blocks of a uint8 stream, read on indexing: `table` maps a byte to its token id."""

    def __init__(self, stream: np.ndarray, seq_len: int, table: np.ndarray, max_bytes: int | None = None):
        self.stream, self.seq_len, self.table = stream, seq_len, table
        usable = len(stream) if max_bytes is None else min(len(stream), max_bytes)
        self.n = usable // seq_len

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.seq_len)

    def __len__(self) -> int:
        return self.n

    def _rows(self, rows: np.ndarray) -> torch.Tensor:
        idx = rows[:, None] * self.seq_len + np.arange(self.seq_len)[None, :]
        return torch.from_numpy(self.table[self.stream[idx]])

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, slice):
            return self._rows(np.arange(self.n)[index])
        rows = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64)
        if rows.ndim == 0:
            return self._rows(rows[None])[0]
        if len(rows) and (rows.min() < -self.n or rows.max() >= self.n):
            raise IndexError(f"block index out of range for {self.n} blocks")
        return self._rows(rows % max(1, self.n))


class ConcatBlocks:
    """Several block sets indexed as one (the train blocks of all domains), without copying them."""

    def __init__(self, parts: list):
        self.parts = [p for p in parts if len(p)]
        self.offsets = np.cumsum([0, *[len(p) for p in self.parts]])
        self.seq_len = self.parts[0].shape[1] if self.parts else 0

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.offsets[-1]), self.seq_len)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, slice):
            index = np.arange(len(self))[index]
        rows = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64) % max(1, len(self))
        part = np.searchsorted(self.offsets, rows, side="right") - 1
        out = torch.empty((len(rows), self.seq_len), dtype=torch.long)
        for k in np.unique(part):
            sel = np.nonzero(part == k)[0]
            out[torch.from_numpy(sel)] = self.parts[k][rows[sel] - self.offsets[k]]
        return out


def byte_table(eos_id: int, offset: int = 3) -> np.ndarray:
    """ByT5's ids: byte b is b + 3; the document separator (NUL) is EOS, as `pack` puts it between documents."""
    table = np.arange(256, dtype=np.int64) + offset
    table[0] = eos_id
    return table


def documents(stream: np.ndarray, max_bytes: int | None) -> list[str]:
    """The documents of a stream (up to `max_bytes` of it), as text."""
    raw = bytes(stream[: max_bytes or len(stream)])
    return [d.decode("utf-8", errors="replace") for d in raw.split(b"\0") if d]
