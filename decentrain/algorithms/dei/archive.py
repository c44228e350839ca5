"""DRQ's behaviour descriptors and one round's MAP-Elites archive (pyribs' GridArchive).

DRQ bins four descriptors of a warrior on fixed edges (`drq.py`, `get_bc_features`) and uses
two of them as the archive's axes (default `tsp,mc`: total spawned processes and memory
coverage, both read off its own simulator's trace). pMARS reports no trace, so decentrain's
default axes are DRQ's other pair, `uo,pl` (unique opcodes, program length), which depend on
the warrior alone: the named departure. The bin edges are DRQ's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

try:
    from ribs.archives import GridArchive
except ModuleNotFoundError as missing:  # an optional extra: say which one, in one line
    raise ModuleNotFoundError("DEI needs pyribs: pip install 'decentrain[dei]'") from missing

from decentrain.algorithms.dei.redcode import Warrior

# DRQ's bin edges: a value v falls in bin i when edges[i-1] <= v < edges[i] (6 bins per axis).
BIN_EDGES = {
    "uo": (4, 6, 8, 10, 14),  # unique opcodes
    "pl": (5, 12, 20, 35, 60),  # program length
}
BINS = 6


def descriptor(axis: str, warrior: Warrior) -> int:
    value = {"uo": warrior.unique_opcodes, "pl": len(warrior)}[axis]
    return bisect.bisect_right(BIN_EDGES[axis], value)


@dataclass(frozen=True)
class Elite:
    text: str  # the canonical rendering (what pMARS ran), never a model's or a peer's raw text
    fitness: float
    cell: tuple[int, int]


class Archive:
    """One round's MAP-Elites grid: a warrior's cell is its two descriptors, its objective its fitness."""

    def __init__(self, axes: tuple[str, str] = ("uo", "pl"), seed: int = 0):
        for axis in axes:
            if axis not in BIN_EDGES:
                raise ValueError(f"dei.archive.axes: {axis!r} is unknown; allowed: {sorted(BIN_EDGES)}")
        self.axes = axes
        self.grid = GridArchive(
            solution_dim=(), dims=[BINS, BINS], ranges=[(0, BINS), (0, BINS)], solution_dtype=object, seed=seed
        )

    def cell(self, warrior: Warrior) -> tuple[int, int]:
        a, b = self.axes
        return descriptor(a, warrior), descriptor(b, warrior)

    def add(self, warrior: Warrior, fitness: float) -> bool:
        """Insert if the cell is empty or `fitness` beats its elite; True when it was placed."""
        measures = np.asarray(self.cell(warrior), dtype=float) + 0.5  # the cell's centre
        status = self.grid.add_single(warrior.render(), fitness, measures)["status"]
        return int(status) > 0

    def elites(self) -> list[Elite]:
        data = self.grid.data(["solution", "objective", "measures"])
        return [
            Elite(str(s), float(f), (int(m[0]), int(m[1])))
            for s, f, m in zip(data["solution"], data["objective"], data["measures"])
        ]

    def best(self) -> Elite | None:
        elites = self.elites()
        return max(elites, key=lambda e: e.fitness) if elites else None

    def sample(self, n: int) -> list[str]:
        return [str(s) for s in self.grid.sample_elites(n)["solution"]] if not self.grid.empty else []

    def __len__(self) -> int:
        return len(self.grid)


def merged_stats(elites: list[Elite]) -> dict[str, float]:
    """QD-score (sum of the best fitness per cell) and coverage (cells filled / all) of a union of archives."""
    best: dict[tuple[int, int], float] = {}
    for e in elites:
        best[e.cell] = max(best.get(e.cell, -np.inf), e.fitness)
    return {"qd_score": float(sum(best.values())), "coverage": len(best) / (BINS * BINS), "cells": len(best)}
