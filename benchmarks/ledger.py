"""A ledger of seeds that grows across sessions, and the verdicts its pooled seeds support.

Some evidence comes a few seeds at a time: a GPU is lent for fifteen minutes now and then, and
each visit runs two more seeds. The ledger keeps every such seed in a committed, append-only JSONL
file per benchmark (`benchmarks/results/ledger/<name>.jsonl`, one line per seed), under a *key*:
the conditions the seeds must share to be pooled (for gpu_evidence: the code's numerics, the corpus
hash, the GPU and the protocol). `pooled(name, key, comparisons)` gathers every seed ever appended
under that exact key and applies the decision rule of `benchmarks/protocol.py` to each comparison,
paired by seed: the verdict stays "undecided" until the seeds suffice.

    ledger = Ledger()
    ledger.append("gpu_evidence", key, [{"seed": 4, "arms": {"ddp": {"bpb": 1.31}, "noloco": {"bpb": 1.33}}}],
                  provenance={"git_sha": ..., "dirty": False})
    ledger.pooled("gpu_evidence", key, [Comparison("noloco", "ddp", "reaches")])

Generic on purpose (SAPO's GPU mode keys its own seeds the same way): a seed record is any JSON
object with an integer `seed` and `arms: {arm: {metric: number}}`; the key is any JSON object.

Rules that keep the pool honest:
- a seed is pooled once per key: a later line with the same seed is counted as a duplicate, never
  averaged in (two sessions that ran the same seed did not get independent evidence);
- lines from a dirty tree or a smoke run are kept for the record but left out of the pool unless
  `include_dirty=True`; a line that does not parse (a torn write) is skipped and counted;
- `next_seeds` hands out the smallest seeds not yet in the ledger for that key, so successive
  sessions extend the pool instead of repeating it.

Why JSONL by hand: the record must be a plain committed text file that merges by appending, and
no library does "append-only file of keyed records with pooled paired statistics".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LEDGER_DIR = Path(__file__).resolve().parent / "results" / "ledger"
CLAIMS = ("better", "reaches")


def key_id(key: dict[str, Any]) -> str:
    """A short, stable name for a key: the hash of its canonical JSON."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Comparison:
    """One paired question asked of the pooled seeds: does `contender` beat (claim "better") or match
    within the rule's margin (claim "reaches") `baseline` on `metric`?"""

    contender: str
    baseline: str
    claim: str = "better"
    metric: str = "bpb"
    higher_is_better: bool = False  # e.g. an accuracy (the rule's lower_is_better=False)

    def __post_init__(self) -> None:
        if self.claim not in CLAIMS:
            raise ValueError(f"comparison.claim={self.claim!r} is unknown; allowed: {list(CLAIMS)}")
        if self.contender == self.baseline:
            raise ValueError(f"comparison: contender and baseline are both {self.contender!r}")

    @property
    def label(self) -> str:
        return f"{self.contender} {self.claim} {self.baseline} ({self.metric})"


@dataclass
class Pool:
    """Every usable seed under one key, and what was left out."""

    seeds: dict[int, dict[str, Any]] = field(default_factory=dict)  # seed -> its record (first appended wins)
    duplicates: int = 0  # later lines for a seed already pooled
    excluded_dirty: int = 0  # lines from a dirty tree or a smoke run
    torn: int = 0  # lines that did not parse (in the whole file)

    def paired(self, comparison: Comparison) -> tuple[list[int], list[float], list[float]]:
        """(seeds, contender values, baseline values) of the seeds that hold both arms' metric."""
        ids, con, base = [], [], []
        for s in sorted(self.seeds):
            arms = self.seeds[s].get("arms", {})
            a = _number(arms.get(comparison.contender, {}).get(comparison.metric))
            b = _number(arms.get(comparison.baseline, {}).get(comparison.metric))
            if a is not None and b is not None:
                ids.append(s)
                con.append(a)
                base.append(b)
        return ids, con, base


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


class Ledger:
    """The append-only seed files of every benchmark that keeps one, under `root`."""

    def __init__(self, root: Path = LEDGER_DIR):
        self.root = Path(root)

    def path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"ledger name {name!r}: a plain file stem, e.g. 'gpu_evidence'")
        return self.root / f"{name}.jsonl"

    def append(
        self, name: str, key: dict[str, Any], seeds: Sequence[dict[str, Any]], provenance: dict[str, Any] | None = None
    ) -> int:
        """Add one line per seed record under `key`; returns how many were written. Each line is flushed
        and fsynced, so a session killed mid-run keeps the seeds it finished."""
        for rec in seeds:
            if not isinstance(rec.get("seed"), int) or isinstance(rec.get("seed"), bool):
                raise ValueError(f"ledger {name}: a seed record needs an integer 'seed', got {rec.get('seed')!r}")
            if not isinstance(rec.get("arms"), dict):
                raise ValueError(f"ledger {name}: seed {rec['seed']} needs 'arms': {{arm: {{metric: value}}}}")
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with path.open("a") as f:
            for rec in seeds:
                line = {
                    "key_id": key_id(key),
                    "key": key,
                    "seed": rec["seed"],
                    "record": rec,
                    "provenance": provenance or {},
                    "appended": stamp,
                }
                f.write(json.dumps(line, sort_keys=True, allow_nan=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return len(seeds)

    def lines(self, name: str) -> tuple[list[dict[str, Any]], int]:
        """(every parsed line, number of lines that did not parse)."""
        path = self.path(name)
        if not path.exists():
            return [], 0
        out, torn = [], 0
        for text in path.read_text().splitlines():
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                if not isinstance(line, dict) or not isinstance(line.get("seed"), int) or "key_id" not in line:
                    raise ValueError(text[:80])
                out.append(line)
            except ValueError:
                torn += 1
        return out, torn

    def pool(self, name: str, key: dict[str, Any], include_dirty: bool = False) -> Pool:
        lines, torn = self.lines(name)
        pool = Pool(torn=torn)
        kid = key_id(key)
        for line in lines:
            if line["key_id"] != kid:
                continue
            prov = line.get("provenance") or {}
            if not include_dirty and (prov.get("dirty") or prov.get("smoke")):
                pool.excluded_dirty += 1
                continue
            if line["seed"] in pool.seeds:
                pool.duplicates += 1
                continue
            pool.seeds[line["seed"]] = line.get("record") or {}
        return pool

    def next_seeds(self, name: str, key: dict[str, Any], n: int) -> list[int]:
        """The `n` smallest seeds not yet appended under `key` (dirty lines count: their seeds are used)."""
        used = set(self.pool(name, key, include_dirty=True).seeds)
        out, s = [], 0
        while len(out) < n:
            if s not in used:
                out.append(s)
            s += 1
        return out

    def keys(self, name: str) -> dict[str, dict[str, Any]]:
        """key_id -> key, for every key in the ledger (a report can show what else has seeds)."""
        return {line["key_id"]: line.get("key", {}) for line in self.lines(name)[0]}

    def pooled(
        self,
        name: str,
        key: dict[str, Any],
        comparisons: Sequence[Comparison],
        rule: dict[str, Any] | None = None,
        include_dirty: bool = False,
        decide_fn: Callable[..., dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Every seed under `key` pooled, and each comparison decided by the rule (paired by seed).

        `rule` holds the DecisionRule's settings other than the claim (margin, alpha, power), which each
        comparison supplies; `decide_fn(contender, baseline, rule)` defaults to benchmarks.protocol.decide.
        """
        pool = self.pool(name, key, include_dirty)
        decide, make_rule = _protocol(decide_fn)
        out = {
            "key_id": key_id(key),
            "key": key,
            "seeds": sorted(pool.seeds),
            "duplicates": pool.duplicates,
            "excluded_dirty": pool.excluded_dirty,
            "torn_lines": pool.torn,
            "rule": dict(rule or {}),
            "comparisons": [],
        }
        for c in comparisons:
            ids, con, base = pool.paired(c)
            row: dict[str, Any] = {**asdict(c), "label": c.label, "seeds": ids}
            try:  # the rule says "undecided" itself when the pairs are too few for an interval
                row |= decide(
                    con, base, make_rule(claim=c.claim, lower_is_better=not c.higher_is_better, **(rule or {}))
                )
            except ValueError as e:  # the rule refusing these seeds is an undecided verdict, said why
                row |= {"verdict": "undecided", "why": str(e)}
            row.setdefault("n", len(ids))
            out["comparisons"].append(row)
        return out


def _protocol(
    decide_fn: Callable[..., dict[str, Any]] | None,
) -> tuple[Callable[..., dict[str, Any]], Callable[..., Any]]:
    """(decide, DecisionRule) from benchmarks.protocol; a given `decide_fn` (tests, another rule) takes the
    rule as a plain dict of the same fields."""
    if decide_fn is not None:
        return decide_fn, lambda **kw: dict(kw)
    from benchmarks.protocol import DecisionRule, decide

    return decide, DecisionRule


def verdict_lines(pooled: dict[str, Any]) -> list[str]:
    """One line per comparison: its label, and the rule's own description of the result (benchmarks.protocol.describe:
    verdict, paired mean difference, interval, p, and what an undecided run would need)."""
    from benchmarks.protocol import describe

    lines = []
    for c in pooled["comparisons"]:
        text = (
            describe(c)
            if c.get("ci") is not None or "verdict" not in c
            else f"{c['verdict']} ({c.get('why', 'no interval')})"
        )
        lines.append(f"{c['label']}, {c['n']} paired seed(s): {text}")
    return lines
