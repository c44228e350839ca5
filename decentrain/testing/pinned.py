"""A small pinned source set for tests: a tarball written here, pinned by its sha256, and two domains.

It exercises every step of `decentrain data prepare` without a registry: exact and near duplicates,
editions of one work (a group), and a sentence that a held-out document shares with a train one.
"""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

from decentrain.data.pinned_domains import Domain
from decentrain.data.prepare import PrepareConfig
from decentrain.data.sources import Source, members

WORDS = (
    "the of and to in is was that for on with as by at from his her they which be this are or one had not but "
    "what all were when we there can an your which their said if do will each about how up out them then she "
    "many some so these would other into has more two like him see time could no make than first been its who "
    "now people my made over did down only way find use may water long little very after words called just "
    "where most know get through back much before go good new write our used me man too any day same right "
    "look think also around another came come work three word must because does part even place well such"
).split()
SHARED = (
    "A sentence that every edition of the chronicle repeats word for word, long enough to be a leak on its own, "
    "and then some more words so that it spans well over sixty-four bytes of text."
)


def _prose(rng: random.Random, n_words: int) -> str:
    lines, words = [], []
    for _ in range(n_words):
        words.append(rng.choice(WORDS))
        if len(words) == 12:
            lines.append(" ".join(words).capitalize() + ".")
            words = []
    return "\n".join(lines) + "\n"


def write_source(tmp: Path, docs_per_domain: int = 40, words: int = 400, seed: int = 0) -> Source:
    """A tar.gz with `alpha/*.txt` and `beta/*.txt`: distinct documents, plus an exact copy, a near copy
    and a shared sentence planted in several documents."""
    rng = random.Random(seed)
    files: dict[str, str] = {}
    for domain in ("alpha", "beta"):
        for i in range(docs_per_domain):
            files[f"{domain}/doc{i:03d}.txt"] = _prose(rng, words)
    files["alpha/copy_of_doc000.txt"] = files["alpha/doc000.txt"]  # exact duplicate
    near = files["alpha/doc001.txt"].split("\n")
    near[3] = "An edited line in an otherwise identical document."
    files["alpha/near_doc001.txt"] = "\n".join(near)  # near duplicate
    for i in range(0, docs_per_domain, 3):  # one sentence in many documents: the held-out ones lose it
        files[f"beta/doc{i:03d}.txt"] += SHARED + "\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(files):
            data = files[name].encode()
            info = tarfile.TarInfo(f"pkg-1.0/{name}")
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    path = tmp / "pkg-1.0.tar.gz"
    path.write_bytes(buf.getvalue())
    return Source("pkg", "1.0", "file", str(path), hashlib.sha256(buf.getvalue()).hexdigest(), len(buf.getvalue()))


def _reader(domain: str):
    def extract(trees: dict):
        for path, raw in members(trees["pkg"], (".txt",), f"pkg-1.0/{domain}/"):
            yield path.rsplit("/", 1)[-1].removeprefix("copy_of_").removeprefix("near_"), raw.decode()

    return extract


def tiny_domains(source: Source, max_train_bytes: int = 10**9) -> list[Domain]:
    return [Domain(name, (source,), _reader(name), max_train_bytes) for name in ("alpha", "beta")]


def tiny_config(out: Path) -> PrepareConfig:
    """Held-out splits of about 5 kB per domain (documents are about 2.3 kB), at least 2 kB after the cut,
    no tool pins."""
    return PrepareConfig(
        out=out,
        domains=["alpha", "beta"],
        val_bytes=5_000,
        test_bytes=5_000,
        min_piece=32,
        min_heldout_bytes=2_000,
        pinned_tools=None,
    )
