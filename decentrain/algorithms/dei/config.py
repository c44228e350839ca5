"""Typed configuration of a DEI search: the search itself, Core War, sharing, and one operator per node."""

from __future__ import annotations

import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decentrain.algorithms.dei.archive import BIN_EDGES
from decentrain.algorithms.dei.operators import OperatorConfig
from decentrain.algorithms.dei.pmars import MAX_WARRIORS, PMarsConfig
from decentrain.algorithms.dei.redcode import RedcodeLimits
from decentrain.algorithms.dei.sharing import ShareConfig


@dataclass
class SearchConfig:
    """DRQ's round structure (`drq.py` Args), per node."""

    rounds: int = 3  # DRQ n_rounds: each round's archive is evolved against the champions so far
    iters: int = 16  # DRQ n_iters: model calls per round after the initial population
    n_init: int = 4  # DRQ n_init: new warriors written at a round's start
    sample_new_percent: float = 0.1  # DRQ: chance an iteration writes a new warrior instead of mutating an elite
    last_k_opps: int | None = None  # DRQ: only the last k champions as opponents (None: all)
    fitness_threshold: float | None = None  # DRQ: a round whose best passes this stops early (None: never)
    axes: list[str] = field(default_factory=lambda: ["uo", "pl"])
    initial_opponents: list[str] = field(default_factory=lambda: ["imp", "dwarf"])  # shipped names or paths
    calls: int | None = None  # model calls this node may make in the whole run (None: rounds x (n_init + iters))

    def __post_init__(self) -> None:
        for name, low, high in (("rounds", 1, 10_000), ("iters", 1, 1_000_000), ("n_init", 0, 10_000)):
            value = getattr(self, name)
            if not _is_int(value) or not low <= value <= high:
                raise ValueError(f"search.{name}={value!r} must be an integer in [{low}, {high}]")
        if not (isinstance(self.sample_new_percent, (int, float)) and 0 <= self.sample_new_percent <= 1):
            raise ValueError(f"search.sample_new_percent={self.sample_new_percent!r} must be in [0, 1]")
        if self.last_k_opps is not None and (not _is_int(self.last_k_opps) or self.last_k_opps < 1):
            raise ValueError(f"search.last_k_opps={self.last_k_opps!r} must be an integer >= 1 or null")
        if self.fitness_threshold is not None and not (
            isinstance(self.fitness_threshold, (int, float)) and math.isfinite(self.fitness_threshold)
        ):
            raise ValueError(f"search.fitness_threshold={self.fitness_threshold!r} must be finite or null")
        if len(self.axes) != 2 or any(a not in BIN_EDGES for a in self.axes) or self.axes[0] == self.axes[1]:
            raise ValueError(f"search.axes={list(self.axes)} must be two different ones of {sorted(BIN_EDGES)}")
        if not self.initial_opponents or not all(isinstance(n, str) and n for n in self.initial_opponents):
            raise ValueError("search.initial_opponents must name at least one warrior")
        if self.calls is not None and (not _is_int(self.calls) or not 1 <= self.calls <= 10**7):
            raise ValueError(f"search.calls={self.calls!r} must be an integer in [1, 10000000] or null")
        if self.battle_size > MAX_WARRIORS:  # refused, not capped: a cap would silently change the search
            n, champions = len(self.initial_opponents), self.battle_size - 1 - len(self.initial_opponents)
            raise ValueError(
                f"search.rounds={self.rounds}: the last round's battles would hold {self.battle_size} "
                f"warriors (1 new, {n} initial opponents, {champions} champions) and pMARS takes "
                f"at most {MAX_WARRIORS}: set search.last_k_opps <= {MAX_WARRIORS - 1 - n} or "
                f"search.rounds <= {MAX_WARRIORS - n}"
            )

    @property
    def battle_size(self) -> int:
        """Warriors in the run's largest battle: the new one, the initial opponents and the champions
        of every earlier round (the last `last_k_opps` of them)."""
        champions = self.rounds - 1 if self.last_k_opps is None else min(self.rounds - 1, self.last_k_opps)
        return 1 + len(self.initial_opponents) + champions

    @property
    def budget(self) -> int:
        return self.calls if self.calls is not None else self.rounds * (self.n_init + self.iters)


@dataclass
class DEIConfig:
    num_nodes: int = 4
    search: SearchConfig = field(default_factory=SearchConfig)
    pmars: PMarsConfig = field(default_factory=PMarsConfig)
    redcode: RedcodeLimits = field(default_factory=RedcodeLimits)
    share: ShareConfig = field(default_factory=ShareConfig)
    operator: OperatorConfig = field(default_factory=OperatorConfig)  # every node's, unless `nodes` overrides it
    nodes: list[dict[str, Any]] = field(default_factory=list)  # nodes[i]: node i's operator fields
    seed: int = 0
    threads: int = 1
    run_dir: str = "runs/dei"

    def __post_init__(self) -> None:
        if not _is_int(self.num_nodes) or not 1 <= self.num_nodes <= 64:
            raise ValueError(f"num_nodes={self.num_nodes!r} must be in [1, 64]")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed={self.seed!r} must be an integer in [0, 2**32)")
        if not _is_int(self.threads) or not 1 <= self.threads <= 1024:
            raise ValueError(f"threads={self.threads!r} must be an integer in [1, 1024]")
        check_run_dir(self.run_dir)
        if len(self.nodes) > self.num_nodes:
            raise ValueError(f"nodes has {len(self.nodes)} entries for num_nodes={self.num_nodes}")
        if self.redcode.core_size != self.pmars.core_size:
            raise ValueError(
                f"redcode.core_size={self.redcode.core_size} must equal pmars.core_size={self.pmars.core_size}"
            )
        if self.redcode.max_instructions > self.pmars.max_length:
            raise ValueError(
                f"redcode.max_instructions={self.redcode.max_instructions} must be <= "
                f"pmars.max_length={self.pmars.max_length}"
            )
        if self.share.max_chars > self.redcode.max_chars:  # a longer elite could never parse here
            raise ValueError(
                f"share.max_chars={self.share.max_chars} must be <= redcode.max_chars={self.redcode.max_chars}"
            )
        for i in range(len(self.nodes)):
            self.node_operator(i)  # each node's operator validates before any node starts

    def node_operator(self, i: int) -> OperatorConfig:
        """Node i's operator: `operator` with `nodes[i]`'s fields (and `nodes[i].model`'s) over it."""
        from omegaconf import OmegaConf  # the one merge rule Hydra users know

        base = OmegaConf.structured(self.operator)
        override = self.nodes[i] if i < len(self.nodes) else {}
        if not isinstance(override, dict):
            raise ValueError(f"nodes[{i}] must be a mapping of operator fields")
        unknown = set(override) - set(OperatorConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"nodes[{i}].{sorted(unknown)[0]} is not an operator field")
        try:
            return OmegaConf.to_object(OmegaConf.merge(base, override))
        except ValueError as e:
            raise ValueError(f"nodes[{i}]: {e}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_run_dir(run_dir: str) -> None:
    """`run_dir` is a directory or can become one: a file on its way is an error here, in one line,
    not a traceback in every node (whether this user may write there is `run.preflight`'s check)."""
    if not isinstance(run_dir, str) or not run_dir or "\0" in run_dir:
        raise ValueError(f"run_dir={run_dir!r} must be a path")
    path = Path(run_dir).absolute()
    for p in (path, *path.parents):  # the nearest one that exists decides
        try:
            mode = p.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            raise ValueError(f"run_dir={run_dir}: {p}: {e.strerror}") from None
        if not stat.S_ISDIR(mode):
            raise ValueError(f"run_dir={run_dir}: {p} is not a directory")
        return
