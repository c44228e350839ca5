"""One DEI node: DRQ's rounds of MAP-Elites with a language model as the mutation operator, plus sharing.

Round r (DRQ, `drq.py` `Main.run`): a fresh archive; the elites peers shared at the end of
round r-1 and `n_init` newly written warriors seed it; then `iters` times, with probability
`sample_new_percent` (or while the archive is empty) the model writes a new warrior, else it
rewrites an elite drawn uniformly from the archive. A warrior's fitness is its survival share
in one pMARS battle against the initial opponents and every earlier round's champion (the
Red Queen: each round must beat all the champions so far). The round's champion is its
archive's best. At the round's end the node shares its best elites (DEI) and stops early if
the best passes `fitness_threshold`.

Every warrior, the model's or a peer's, goes through `redcode.parse` first; a peer's elite is
re-evaluated here (its sender's fitness is never read) and at most `max_elites_per_peer` are
taken from one peer per round, so each sender's cost to this node is bounded.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from decentrain.algorithms.dei.archive import BINS, Archive, Elite
from decentrain.algorithms.dei.config import DEIConfig
from decentrain.algorithms.dei.operators import BudgetedOperator, Request
from decentrain.algorithms.dei.pmars import MAX_WARRIORS, battle
from decentrain.algorithms.dei.redcode import Warrior, parse
from decentrain.algorithms.dei.sharing import StoreSharing

log = logging.getLogger(__name__)


def load_warrior(name: str, cfg: DEIConfig) -> Warrior:
    """A shipped warrior by name (`imp`, `dwarf`, ...) or a path; ValueError naming it if it does not parse."""
    shipped = resources.files("decentrain.algorithms.dei") / "warriors" / f"{name}.red"
    path = Path(name)
    text = shipped.read_text() if shipped.is_file() else path.read_text() if path.is_file() else None
    if text is None:
        raise ValueError(f"search.initial_opponents: {name!r} is neither a shipped warrior nor a file")
    result = parse(text, cfg.redcode)
    if result.warrior is None:
        raise ValueError(f"search.initial_opponents: {name!r} does not parse ({result.error})")
    return result.warrior


class DEINode:
    def __init__(
        self, cfg: DEIConfig, rank: int, operator: BudgetedOperator, sharing: StoreSharing | None, run_dir: Path
    ):
        self.cfg, self.rank, self.operator, self.sharing = cfg, rank, operator, sharing
        self.run_dir = run_dir
        self.seed = cfg.seed * 1000 + rank
        self.rng = np.random.default_rng(self.seed)
        self.initial = [load_warrior(n, cfg) for n in cfg.search.initial_opponents]
        self.champions: list[Warrior] = []
        self.champion_rounds: list[int] = []  # the round each champion won (a round with no elites has none)
        self.champions_saved = 0
        self.archives: list[Archive] = []
        self.inbox: list[str] = []  # peers' elites for the next round
        self.counts: Counter[str] = Counter()
        self.battles = 0

    # -- evaluation ------------------------------------------------------------------------------

    def opponents(self) -> list[Warrior]:
        k = self.cfg.search.last_k_opps
        return self.initial + (self.champions[-k:] if k else self.champions)

    def fitness(self, warrior: Warrior) -> float | None:
        """Survival share in one battle against all current opponents (DRQ's multi-warrior battle)."""
        self.battles += 1
        result = battle([warrior, *self.opponents()], self.cfg.pmars, seed=self.seed + self.battles)
        return None if result is None else result.share(0)

    def consider(self, archive: Archive, text: str, source: str) -> None:
        """Parse, evaluate and offer one warrior to the archive; every failure is counted by source."""
        parsed = parse(text, self.cfg.redcode)
        if parsed.warrior is None:
            self.counts[f"{source}/unparsable"] += 1
            return
        fit = self.fitness(parsed.warrior)
        if fit is None:
            self.counts[f"{source}/battle_failed"] += 1
            return
        self.counts[f"{source}/evaluated"] += 1
        if archive.add(parsed.warrior, fit):
            self.counts[f"{source}/placed"] += 1

    # -- one round -------------------------------------------------------------------------------

    def write(self, archive: Archive, n: int, new: bool) -> None:
        if new or len(archive) == 0:
            requests = [Request(None) for _ in range(n)]
        else:
            opponents = tuple(w.render() for w in self.opponents())
            requests = [Request(p, opponents) for p in archive.sample(n)]
        for text in self.operator.generate(requests, self.rng):
            if text is not None:  # a failed call is counted by the operator (calls_failed)
                self.consider(archive, text, "model")

    def run_round(self, round_: int) -> dict[str, Any]:
        search = self.cfg.search
        archive = Archive(tuple(search.axes), seed=self.seed + round_)
        self.archives.append(archive)
        for text in self.inbox:
            self.consider(archive, text, "peer")
        self.inbox = []
        self.write(archive, search.n_init, new=True)
        for _ in range(search.iters):
            if search.fitness_threshold is not None and (b := archive.best()) and b.fitness > search.fitness_threshold:
                break
            self.write(archive, 1, new=self.rng.random() < search.sample_new_percent)
        best = archive.best()
        if best is not None:
            self.champions.append(parse(best.text, self.cfg.redcode).warrior)
            self.champion_rounds.append(round_)
        received = self.share(round_, archive)
        return {
            "round": round_,
            "elites": len(archive),
            "best_fitness": best.fitness if best else None,
            "calls_used": self.operator.used,
            "calls_failed": self.operator.failed,
            "battles": self.battles,
            "peer_elites_received": received,
            **{k: v for k, v in sorted(self.counts.items())},
            **{f"call_failed/{k}": v for k, v in sorted(self.operator.failure_counts().items())},
            **({f"share_dropped/{k}": v for k, v in self.sharing.drops.items()} if self.sharing else {}),
        }

    def share(self, round_: int, archive: Archive) -> int:
        if self.sharing is None:
            return 0
        mine = sorted(archive.elites(), key=lambda e: -e.fitness)[: self.cfg.share.elites]
        got = self.sharing.exchange(round_, [e.text for e in mine])
        self.inbox = [t for texts in got.values() for t in texts]
        return len(self.inbox)

    def run(self) -> list[dict[str, Any]]:
        out_dir = self.run_dir / f"node{self.rank}"
        out_dir.mkdir(parents=True, exist_ok=True)
        history = []
        with open(out_dir / "metrics.jsonl", "a") as f:
            for r in range(self.cfg.search.rounds):
                metrics = self.run_round(r)
                self.save(out_dir)  # every round's: a node that dies later keeps its finished rounds
                history.append(metrics)
                f.write(json.dumps(metrics, allow_nan=False) + "\n")
                f.flush()
                log.info(
                    "node %d round %d: %d elites, best %s, %d model calls (%d failed), %d peer elites",
                    self.rank,
                    r,
                    metrics["elites"],
                    metrics["best_fitness"],
                    metrics["calls_used"],
                    metrics["calls_failed"],
                    metrics["peer_elites_received"],
                )
        return history

    def save(self, out_dir: Path) -> None:
        """Every round's elites so far (the merged-archive figures read these), then the champions as
        .red files; each file is replaced whole, so a reader never sees half of one."""
        doc = [[e.__dict__ | {"cell": list(e.cell)} for e in a.elites()] for a in self.archives]
        _write_atomic(
            out_dir / "archive.json",
            json.dumps({"rank": self.rank, "axes": list(self.cfg.search.axes), "rounds": doc}, allow_nan=False),
        )
        for r, champ in list(zip(self.champion_rounds, self.champions))[self.champions_saved :]:
            _write_atomic(out_dir / f"round_{r:03d}_champion.red", champ.render(f"node{self.rank}_round{r}"))
        self.champions_saved = len(self.champions)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


MAX_ARCHIVE_BYTES = 64 << 20  # a node's archive.json: rounds x 36 elites x a warrior's few kB, with room


def read_elites(
    run_dir: Path,
    last_round_only: bool = True,
    drops: Counter | None = None,
    num_nodes: int | None = None,
    max_chars: int = 1 << 20,
) -> list[Elite]:
    """The elites the nodes saved under `run_dir` (each one's final round by default; with
    `num_nodes`, only node0..node{num_nodes-1}). A file or entry that is not what `save` writes
    (too large, not JSON, a non-finite number, a cell off the grid, more elites than cells) is
    skipped and counted in `drops`, never raised."""
    drops = Counter() if drops is None else drops
    paths = (
        sorted(run_dir.glob("node*/archive.json"))
        if num_nodes is None
        else [p for i in range(num_nodes) if (p := run_dir / f"node{i}" / "archive.json").exists()]
    )
    out = []
    for path in paths:
        doc = read_json(path, MAX_ARCHIVE_BYTES)
        rounds = doc.get("rounds") if isinstance(doc, dict) else None
        if not isinstance(rounds, list) or not all(isinstance(r, list) for r in rounds):
            drops["bad_archive"] += 1
            continue
        for elites in rounds[-1:] if last_round_only else rounds:
            if len(elites) > BINS * BINS:  # a round's archive has one elite per cell at most
                drops["too_many_elites"] += len(elites) - BINS * BINS
            for entry in elites[: BINS * BINS]:
                if (elite := _elite(entry, max_chars)) is None:
                    drops["bad_elite"] += 1
                else:
                    out.append(elite)
    return out


def _elite(entry: Any, max_chars: int) -> Elite | None:
    if not (isinstance(entry, dict) and isinstance(entry.get("text"), str) and len(entry["text"]) <= max_chars):
        return None
    fitness, cell = entry.get("fitness"), entry.get("cell")
    # a survival share is at most the battle's size; an exact comparison (no float() of a huge int)
    if not (isinstance(fitness, (int, float)) and not isinstance(fitness, bool) and 0 <= fitness <= MAX_WARRIORS):
        return None
    if not (isinstance(cell, list) and len(cell) == 2 and all(type(c) is int and 0 <= c < BINS for c in cell)):
        return None
    return Elite(entry["text"], float(fitness), (cell[0], cell[1]))


def read_json(path: Path, max_bytes: int) -> Any:
    """`path`'s JSON document, or None if it is missing, larger than `max_bytes` (checked before
    reading) or not JSON; never raises. NaN and Infinity parse: the reader checks each number it uses."""
    try:
        if path.stat().st_size > max_bytes:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    return loads_json(data)


def loads_json(data: bytes | str, finite: bool = False) -> Any:
    """json.loads, or None for anything that is not JSON (with `finite`, or that holds NaN,
    Infinity or a float that overflows, like 1e999); never raises."""
    try:
        if finite:
            return json.loads(data, parse_constant=_refuse, parse_float=_finite)
        return json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; RecursionError: "[" * 32000
        return None


def _refuse(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value
