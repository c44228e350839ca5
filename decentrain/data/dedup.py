"""Byte n-gram hashing for the pinned corpus: held-out text cut where it occurs in train, near-duplicates.

Both run on hundreds of MB of text, so everything is numpy over uint8 streams in which documents are
separated by a NUL byte (text never holds one: `normalize` removes it). Written here rather than taken
from a library: datasketch's MinHash hashes each shingle in Python (hours at this size), and no
maintained package does "cut every held-out span whose 64-byte window occurs in train".

The window hash is a polynomial hash mod 2**64 built by doubling (6 passes for 64 bytes); a collision
can only make a cut or a duplicate call too eager, never let a leak through.
"""

from __future__ import annotations

import numpy as np

WINDOW = 64
SEP = 0  # the document separator in a stream
_P = np.uint64(0x100000001B3)  # FNV-64 prime: odd, so multiplication by it is a bijection mod 2**64
_CHUNK = 1 << 24  # bytes per hashing pass: bounds the memory of one pass to a few hundred MB


def window_chunks(stream: np.ndarray, window: int = WINDOW):
    """(hashes, start offsets) of the `window`-byte slices of `stream` that hold no separator, chunk by chunk."""
    if window & (window - 1):
        raise ValueError(f"window={window} must be a power of 2")
    for lo in range(0, max(0, len(stream) - window + 1), _CHUNK):
        part = np.asarray(stream[lo : lo + _CHUNK + window - 1])
        h = part.astype(np.uint64) + np.uint64(1)  # +1: a byte never hashes like an absent one
        width, mult = 1, _P
        with np.errstate(over="ignore"):
            while width < window:  # h[i] covers part[i : i + 2*width] after this pass
                h = h[:-width] * mult + h[width:]
                mult = mult * mult
                width *= 2
        n = len(part) - window + 1
        zeros = np.concatenate([[0], np.cumsum(part == SEP, dtype=np.int64)])
        clean = (zeros[window : window + n] - zeros[:n]) == 0
        yield h[:n][clean], np.nonzero(clean)[0] + lo


def window_hashes(stream: np.ndarray, window: int = WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """Hash of every `window`-byte slice of `stream` that holds no separator, and its start offset."""
    chunks = list(window_chunks(stream, window))
    if not chunks:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    return np.concatenate([h for h, _ in chunks]), np.concatenate([s for _, s in chunks])


def member(h: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """h[i] in sorted_set, by binary search (np.isin sorts both arrays again on every call)."""
    if not len(sorted_set):
        return np.zeros(len(h), bool)
    return sorted_set[np.minimum(np.searchsorted(sorted_set, h), len(sorted_set) - 1)] == h


def hashes_in(streams, probe: np.ndarray) -> np.ndarray:
    """The subset of the (sorted, unique) `probe` hashes that occur in any of `streams`."""
    found = []
    for stream in streams:
        for h, _ in window_chunks(stream):
            h = np.sort(h)  # sorted keys make the binary searches walk the probe in order (cache friendly)
            found.append(h[member(h, probe)])
    return np.unique(np.concatenate(found)) if found else np.zeros(0, np.uint64)


def leak_rates(heldout: dict, train_streams) -> dict:
    """For each held-out stream (by key), the fraction of its 64-byte windows that occur verbatim in train."""
    hashes = {k: window_hashes(v)[0] for k, v in heldout.items()}
    probe = np.unique(np.concatenate([np.zeros(0, np.uint64), *hashes.values()]))
    found = hashes_in(train_streams, probe)
    return {k: float(member(h, found).mean()) if len(h) else 0.0 for k, h in hashes.items()}


def leak_rate(heldout: np.ndarray, train_streams) -> float:
    """Fraction of `heldout`'s 64-byte windows that occur verbatim in the train streams."""
    return leak_rates({0: heldout}, train_streams)[0]


def cut_spans(stream: np.ndarray, banned: np.ndarray, min_piece: int) -> tuple[np.ndarray, int]:
    """Remove every byte of `stream` covered by a window whose hash is in `banned`.

    A document loses only the covered bytes: it is split where they were, each piece becomes a
    document of its own, and pieces shorter than `min_piece` bytes are dropped. Returns the new
    stream and the number of text bytes removed.
    """
    h, starts = window_hashes(stream)
    hit = starts[member(h, banned)]
    covered = np.zeros(len(stream) + 1, np.int32)
    np.add.at(covered, hit, 1)
    np.add.at(covered, np.minimum(hit + WINDOW, len(stream)), -1)
    keep = np.cumsum(covered[:-1]) == 0
    text = stream != SEP
    removed = int((~keep & text).sum())
    marked = np.where(keep, stream, SEP)  # a cut is a document boundary
    pieces = [p for p in _split_docs(marked) if len(p) >= min_piece]
    return join_docs(pieces), removed


def _split_docs(stream: np.ndarray) -> list[np.ndarray]:
    bounds = np.nonzero(stream == SEP)[0]
    pieces, lo = [], 0
    for b in [*bounds.tolist(), len(stream)]:
        if b > lo:
            pieces.append(stream[lo:b])
        lo = b + 1
    return pieces


def join_docs(docs: list[np.ndarray]) -> np.ndarray:
    """Documents (uint8 arrays) into one stream, each followed by the separator."""
    if not docs:
        return np.zeros(0, np.uint8)
    sep = np.array([SEP], np.uint8)
    return np.concatenate([part for d in docs for part in (d, sep)])


def near_duplicates(
    docs: list[bytes], threshold: float = 0.8, perms: int = 32, bands: int = 8, seed: int = 0
) -> set[int]:
    """Indices of documents that are near-duplicates of an earlier one (MinHash over 64-byte windows).

    Each document's window hashes are sampled (1 in 8, by value, so two copies sample alike), then
    `perms` min-hashes (x -> a*x + b mod 2**64) summarise the set. Documents that agree on all rows
    of any of `bands` bands are candidates; a candidate whose min-hash agreement reaches `threshold`
    (the Jaccard estimate) is dropped in favour of the earlier document.
    """
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**63, perms, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**63, perms, dtype=np.uint64)
    sigs = np.full((len(docs), perms), np.iinfo(np.uint64).max, np.uint64)
    for i, d in enumerate(docs):
        h, _ = window_hashes(np.frombuffer(d, np.uint8))
        h = h[(h & np.uint64(7)) == 0]
        if len(h):
            with np.errstate(over="ignore"):
                sigs[i] = (h[:, None] * a[None, :] + b[None, :]).min(axis=0)
    rows = perms // bands
    drop: set[int] = set()
    for band in range(bands):
        first: dict[bytes, int] = {}
        for i in range(len(docs)):
            if i in drop or sigs[i, 0] == np.iinfo(np.uint64).max:
                continue  # too short to sample: exact duplicates are removed elsewhere
            key = sigs[i, band * rows : (band + 1) * rows].tobytes()
            j = first.setdefault(key, i)
            if j != i and (sigs[i] == sigs[j]).mean() >= threshold:
                drop.add(i)
    return drop
