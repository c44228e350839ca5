"""`data.source=pinned`: the corpus `decentrain data prepare` built, verified, named by its hash, read in place.

Every process that builds it checks the shards against the manifest. The full sha256 pass (about a
second per 200 MB) runs once per change of the files: a stamp beside the manifest records the sizes
and modification times that passed, and a later process with the same ones checks sizes only.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from transformers import ByT5Tokenizer

from decentrain.data.blocks import CORPUS_SOURCES, Corpus, CorpusSource, DataConfig, pack, token_byte_lengths
from decentrain.data.pinned import (
    ConcatBlocks,
    CorpusError,
    MappedBlocks,
    byte_table,
    documents,
    resolve_dir,
    shard_streams,
    verify,
)

STAMP = ".verified.json"


def _files(root: Path, manifest: dict) -> dict[str, list[int]]:
    out = {}
    for s in manifest["shards"]:
        st = (root / s["path"]).stat()
        out[s["path"]] = [st.st_size, st.st_mtime_ns]
    return out


@lru_cache(maxsize=4)
def verified(root: Path) -> dict:
    """The manifest of the corpus at `root` once its shards check out (cached for the process)."""
    manifest = verify(root, full=False)
    try:
        stamp = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        stamp = None
    if stamp != {"corpus_hash": manifest["corpus_hash"], "files": _files(root, manifest)}:
        manifest = verify(root, full=True)
        try:
            (root / STAMP).write_text(
                json.dumps({"corpus_hash": manifest["corpus_hash"], "files": _files(root, manifest)})
            )
        except OSError:
            pass  # a read-only corpus (shared, another user's): every process checks it in full
    return manifest


def _blocks(streams: list, cfg: DataConfig, tokenizer, max_bytes: int | None):
    if isinstance(tokenizer, ByT5Tokenizer):  # bytes are tokens: map the shard, copy nothing
        table = byte_table(tokenizer.eos_token_id)
        parts = [MappedBlocks(s, cfg.seq_len, table, max_bytes) for s in streams]
        return parts[0] if len(parts) == 1 else ConcatBlocks(parts)
    docs = [d for s in streams for d in documents(s, max_bytes)]
    return pack(docs, tokenizer, cfg.seq_len)


@CORPUS_SOURCES.register("pinned")
class PinnedSource(CorpusSource):
    """The corpus `decentrain data prepare` built, read in place (`data.pinned_dir`), checked by its hash."""

    @staticmethod
    def check(cfg: DataConfig) -> None:
        if cfg.corpus_hash is not None and len(cfg.corpus_hash) < 8:
            raise ValueError(f"data.corpus_hash={cfg.corpus_hash!r}: give at least its first 8 hex digits, or null")

    @staticmethod
    def build(cfg: DataConfig, tokenizer) -> Corpus:
        """Every domain's train, val and test blocks, read from the shards in place."""
        try:
            root = resolve_dir(cfg.pinned_dir)
            manifest = verified(root)
        except CorpusError as e:
            raise ValueError(f"data.pinned_dir: {e}") from None
        if cfg.corpus_hash and not manifest["corpus_hash"].startswith(cfg.corpus_hash):
            raise ValueError(
                f"data.corpus_hash={cfg.corpus_hash}: the corpus at {root} is {manifest['corpus_hash'][:16]}"
            )
        unknown = [d for d in cfg.domains if d not in manifest["domains"]]
        if unknown:
            raise ValueError(
                f"data.domains: {unknown} not in the pinned corpus at {root}; it has {sorted(manifest['domains'])}"
            )
        blocks = {}
        for d in cfg.domains:
            blocks[d] = {
                split: _blocks(
                    shard_streams(root, manifest, d, split),
                    cfg,
                    tokenizer,
                    cfg.max_bytes_per_domain if split == "train" else None,
                )
                for split in ("train", "val", "test")
            }
            if min(len(b) for b in blocks[d].values()) == 0:
                raise ValueError(
                    f"data.seq_len={cfg.seq_len}: the pinned corpus's {d} has a split shorter than one block"
                )
        return Corpus(blocks, "pinned", manifest["corpus_hash"], token_byte_lengths(tokenizer))
