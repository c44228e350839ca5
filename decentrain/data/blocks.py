"""Token blocks: the corpus sources, packing, deterministic per-domain splits, and a resumable sampler.

A corpus comes from one of three sources (`data.source`, a registry):
  offline  text this machine has (decentrain/data/corpus.py): quick, for tests and laptops; it differs
           by machine, so its results say "offline, machine-dependent" and carry no hash;
  pinned   the corpus `decentrain data prepare` builds from pinned registry files (data/prepare.py),
           named by its corpus hash: the one for evidence (data/pinned_source.py);
  hf       any `datasets` dataset, local or from the hub.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import ByT5Tokenizer

from decentrain.core.registry import Registry
from decentrain.data.corpus import DOMAINS, load_domain

SPLITS = ("train", "val", "test")


@dataclass
class DataConfig:
    name: str = "offline"
    source: str = "offline"  # offline: the built-in corpus; pinned: `decentrain data prepare`'s; hf: `datasets`
    domains: list[str] = field(
        default_factory=lambda: ["python_stdlib", "python_docs", "c_headers", "licenses", "arithmetic"]
    )
    seq_len: int = 128
    max_bytes_per_domain: int | None = 400_000  # pinned: train text read per domain (null: all of it)
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    seed: int = 0
    # source=hf
    hf_path: str | None = None  # dataset name/hub id or a local builder ("json", "text", ...)
    hf_data_files: list[str] | None = None
    hf_split: str = "train"
    hf_text_field: str = "text"
    # source=pinned
    pinned_dir: str | None = (
        None  # a prepared corpus, or a pack (.tar.xz); null: $DECENTRAIN_DATA or ~/.cache/decentrain/pinned
    )
    corpus_hash: str | None = None  # when set, a corpus with another hash is refused

    def __post_init__(self) -> None:
        CORPUS_SOURCES.get(self.source, field="data.source").check(self)
        if not self.domains:
            raise ValueError("data.domains must name at least one domain")
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len={self.seq_len} must be >= 2")
        if not (
            0 <= self.val_fraction < 1 and 0 <= self.test_fraction < 1 and self.val_fraction + self.test_fraction < 1
        ):
            raise ValueError("data.val_fraction and data.test_fraction must be in [0, 1) and sum below 1")
        if self.max_bytes_per_domain is not None and self.max_bytes_per_domain < 1:
            raise ValueError(
                f"data.max_bytes_per_domain={self.max_bytes_per_domain} must be >= 1, or null (pinned: all)"
            )


def check_data_files(cfg: DataConfig) -> None:
    """Every `data.hf_data_files` entry (a path or glob) names at least one local file; one-line ValueError."""
    for entry in cfg.hf_data_files or []:
        if "://" in entry or glob.glob(os.path.expanduser(entry), recursive=True):
            continue  # a remote URL is the `datasets` loader's business
        where = Path(entry).expanduser().parent
        close = (
            difflib.get_close_matches(Path(entry).name, sorted(p.name for p in where.iterdir()), n=3)
            if where.is_dir()
            else []
        )
        hint = (
            f"; did you mean {', '.join(str(where / c) for c in close)}?"
            if close
            else f" (looked in {where.resolve()})"
        )
        raise ValueError(f"data.hf_data_files: {entry} matches no file{hint}")


def builds_locally(cfg: DataConfig) -> bool:
    """The corpus comes from this machine (offline or pinned, or local files): cheap to check before start."""
    return CORPUS_SOURCES.get(cfg.source, field="data.source").local(cfg)


def encode(tokenizer, text: str) -> np.ndarray:
    """Token ids without special tokens; ByT5 is bytes + 3, done with numpy for speed."""
    if isinstance(tokenizer, ByT5Tokenizer):
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 3
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def pack(docs: list[str], tokenizer, seq_len: int) -> torch.Tensor:
    """Concatenate documents, each followed by EOS, into [n_blocks, seq_len] (the tail is dropped)."""
    eos = np.array([tokenizer.eos_token_id], dtype=np.int64)
    stream = np.concatenate([part for d in docs for part in (encode(tokenizer, d), eos)])
    n = len(stream) // seq_len
    return torch.from_numpy(stream[: n * seq_len].reshape(n, seq_len).copy())


def split_blocks(blocks: torch.Tensor, val_fraction: float, test_fraction: float) -> dict[str, torch.Tensor]:
    """Contiguous train | val | test ranges of a packed stream; val and test get >= 1 block when asked.

    Contiguous, not shuffled blocks: a shuffled split puts the neighbours of most test
    blocks (same document) into train. Here only the documents at the two cuts straddle.
    """
    n = len(blocks)
    n_test = max(1, round(n * test_fraction)) if test_fraction > 0 else 0
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    if n_test + n_val >= n:
        raise ValueError(
            f"only {n} blocks of data.seq_len tokens: too few for train/val/test splits; "
            "more text (offline: raise data.max_bytes_per_domain) or a lower data.seq_len"
        )
    n_train = n - n_val - n_test
    return {"train": blocks[:n_train], "val": blocks[n_train : n_train + n_val], "test": blocks[n_train + n_val :]}


def unique_shuffled(docs: list[str], seed: int) -> list[str]:
    """Drop exact duplicates (generated problems repeat) and fix a seeded document order."""
    unique = list(dict.fromkeys(docs))
    order = torch.randperm(len(unique), generator=torch.Generator().manual_seed(seed))
    return [unique[i] for i in order]


@dataclass
class Corpus:
    """blocks[domain][split] -> [n, seq_len] token ids (a LongTensor, or blocks mapped from disk), and the
    name of its text: the source's name and the corpus hash, or a note on why there is none."""

    blocks: dict[str, dict[str, Any]]
    name: str = "offline"
    hash: str | None = None
    token_bytes: torch.Tensor | None = None  # UTF-8 bytes each token id stands for (0: special), for bits per byte

    @property
    def identity(self) -> dict[str, Any]:
        """What every metrics file, record and comparison says the run trained on."""
        notes = {"pinned": None, "offline": "machine-dependent"}
        return {"name": self.name, "hash": self.hash, "note": notes.get(self.name, "not hashed")}

    @property
    def label(self) -> str:
        return f"{self.name} {self.hash}" if self.hash else f"{self.name}, {self.identity['note']}"

    def train_blocks(self, domains: list[str] | None = None):
        parts = [self.blocks[d]["train"] for d in (domains or list(self.blocks))]
        if all(isinstance(p, torch.Tensor) for p in parts):
            return torch.cat(parts)
        from decentrain.data.pinned import ConcatBlocks

        return ConcatBlocks(parts)

    def split(self, split: str, domain: str):
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; allowed: {list(SPLITS)}")
        return self.blocks[domain][split]


class CorpusSource:
    """One `data.source`, registered in CORPUS_SOURCES: its config check, whether it is built from this
    machine, and its builder. Static methods only: an entry is a kind of corpus, not a corpus."""

    @staticmethod
    def check(cfg: DataConfig) -> None:
        """ValueError naming the field for a `data` section this source cannot build; called when it is typed."""

    @staticmethod
    def local(cfg: DataConfig) -> bool:
        """The corpus comes from this machine's files: cheap to check before start."""
        return True

    @staticmethod
    def build(cfg: DataConfig, tokenizer) -> Corpus:
        raise NotImplementedError


CORPUS_SOURCES: Registry[type[CorpusSource]] = Registry("data.source")


def token_byte_lengths(tokenizer) -> torch.Tensor:
    """Bytes of text per token id, 0 for special tokens: bits per byte = summed NLL / ln 2 / summed bytes.

    nanochat's rule: each id decoded on its own, special tokens excluded from both sums (EOS between
    documents is no text). ByT5 is exact: every non-special id is one byte.
    """
    n = len(tokenizer)
    special = set(tokenizer.all_special_ids)
    if isinstance(tokenizer, ByT5Tokenizer):
        lengths = [0 if i in special or not 3 <= i < 259 else 1 for i in range(n)]
    else:
        lengths = [0 if i in special else len(tokenizer.decode([i]).encode("utf-8")) for i in range(n)]
    return torch.tensor(lengths, dtype=torch.long)


def packed_corpus(docs: dict[str, list[str]], cfg: DataConfig, tokenizer, name: str) -> Corpus:
    """Documents per domain -> shuffled, packed and split into blocks."""
    return Corpus(
        {
            d: split_blocks(
                pack(unique_shuffled(texts, cfg.seed), tokenizer, cfg.seq_len), cfg.val_fraction, cfg.test_fraction
            )
            for d, texts in docs.items()
        },
        name,
        None,
        token_byte_lengths(tokenizer),
    )


@CORPUS_SOURCES.register("offline")
class OfflineSource(CorpusSource):
    """The built-in domains (data/corpus.py's DOMAINS), from files every install has."""

    @staticmethod
    def check(cfg: DataConfig) -> None:
        for d in cfg.domains:
            DOMAINS.get(d, field="data.domains")

    @staticmethod
    def build(cfg: DataConfig, tokenizer) -> Corpus:
        docs = {
            d: load_domain(d, cfg.max_bytes_per_domain or DataConfig.max_bytes_per_domain, cfg.seed)
            for d in cfg.domains
        }
        return packed_corpus(docs, cfg, tokenizer, "offline")


@CORPUS_SOURCES.register("hf")
class HFSource(CorpusSource):
    """A `datasets` dataset (`data.hf_path`): the text column of one split, as the one domain."""

    @staticmethod
    def check(cfg: DataConfig) -> None:
        if not cfg.hf_path:
            raise ValueError("data.hf_path must be set when data.source=hf")

    @staticmethod
    def local(cfg: DataConfig) -> bool:
        return bool(cfg.hf_data_files and all("://" not in f for f in cfg.hf_data_files))

    @staticmethod
    def build(cfg: DataConfig, tokenizer) -> Corpus:
        import datasets

        ds = datasets.load_dataset(cfg.hf_path, data_files=cfg.hf_data_files, split=cfg.hf_split)
        if cfg.hf_text_field not in ds.column_names:
            raise ValueError(f"data.hf_text_field={cfg.hf_text_field!r} is not a column; columns: {ds.column_names}")
        return packed_corpus(
            {cfg.domains[0]: [t for t in ds[cfg.hf_text_field] if t]}, cfg, tokenizer, f"hf:{cfg.hf_path}"
        )


_BUILT: dict[str, Corpus] = {}


def build_corpus(cfg: DataConfig, tokenizer) -> Corpus:
    """The corpus of `cfg` for `tokenizer`, built once per process: a worker's start-up check and its run
    (and a benchmark's many jobs) share it. Keyed by the whole data config and the tokenizer; the blocks
    are read-only for every caller."""
    key = json.dumps(
        [asdict(cfg), type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), len(tokenizer)],
        sort_keys=True,
        default=str,
    )
    if key not in _BUILT:
        if len(_BUILT) >= 4:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = CORPUS_SOURCES.get(cfg.source, field="data.source").build(cfg, tokenizer)
    return _BUILT[key]


class ShardedSampler:
    """Deterministic, resumable batches over `num_blocks`, sharded by rank.

    Epoch e is a fixed permutation (seed, e). Step s takes the next `global_batch` indices
    and rank r its contiguous slice of them, so the whole state is (epoch, position).
    """

    def __init__(self, num_blocks: int, global_batch: int, rank: int, world_size: int, seed: int):
        if global_batch > num_blocks:
            raise ValueError(f"global batch {global_batch} is larger than the {num_blocks} training blocks")
        self.num_blocks, self.global_batch = num_blocks, global_batch
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.per_rank = global_batch // world_size
        self.epoch, self.position = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))

    def next_indices(self) -> torch.Tensor:
        if self.position + self.global_batch > self.num_blocks:
            self.epoch, self.position = self.epoch + 1, 0
            self._perm = self._permutation(self.epoch)
        start = self.position + self.rank * self.per_rank
        self.position += self.global_batch
        return self._perm[start : start + self.per_rank]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._perm = self._permutation(self.epoch)
