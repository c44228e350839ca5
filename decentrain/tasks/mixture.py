"""A weighted mixture of reasoning-gym tasks, addressed by index so every node can rebuild it.

A peer's question group names its entry (`EntryRef`: task, task-config hash, dataset seed, size,
index); `TaskMixture.rebuild` regenerates that entry here, with this node's own task config, and
the verifier scores against the rebuilt answer. Peers never supply answers or metadata.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import reasoning_gym
from reasoning_gym.factory import DATASETS

from decentrain.tasks.vetted import check_vetted

# Keys of reasoning-gym metadata that no `score_answer` reads; `difficulty` holds tuples.
_DROPPED_METADATA_KEYS = frozenset({"difficulty"})


def known_tasks() -> list[str]:
    return sorted(DATASETS)


def check_task_name(name: str, field_name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"{field_name}={name!r} is unknown; allowed: {known_tasks()}")


MAX_DATASET_SEED = (1 << 31) - 1
_MAX_FOREIGN_DATASETS = 64  # datasets rebuilt for peers' seeds, least recently used evicted


def task_config_id(task: str, kwargs: dict[str, Any]) -> str:
    """16 hex chars naming a task's reasoning-gym config: peers with other settings differ."""
    text = json.dumps({"task": task, "kwargs": kwargs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class EntryRef:
    """Where a question comes from: `create_dataset(task, size=size, seed=seed, **config)[index]`."""

    task: str
    config: str  # task_config_id of the generating node's config for `task`
    seed: int
    size: int
    index: int


class EntryMismatch(ValueError):
    """A peer's group that this node cannot or will not rebuild; `reason` is a metric name."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


REBUILD_DROP_REASONS = ("task_not_in_mix", "task_config_mismatch", "entry_out_of_range", "question_mismatch")


def json_safe(value: Any) -> Any:
    """Convert reasoning-gym metadata to plain JSON types; values with no JSON form become None."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return json_safe(value.item())
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v) for v in value), key=repr)
    return None


@dataclass(frozen=True)
class TaskItem:
    """One question: the text a node shares with its peers, and the metadata its verifier needs."""

    task: str
    question: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)
    ref: EntryRef | None = None  # None for items that come from no dataset (tests, SFT text)


@dataclass
class TaskMixConfig:
    tasks: list[str] = field(default_factory=lambda: ["basic_arithmetic", "chain_sum", "leg_counting"])
    weights: list[float] | None = None  # None: uniform over `tasks`
    size: int = 10_000  # items per task dataset
    seed: int = 0
    # Per-task reasoning-gym config overrides, e.g. {"chain_sum": {"min_terms": 2, "max_terms": 2}}.
    task_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"tasks must name at least one task; allowed: {known_tasks()}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks={self.tasks} lists a task twice")
        for name in self.tasks:
            check_task_name(name, "tasks")
            check_vetted(name, "tasks")
        for name in self.task_kwargs:
            if name not in self.tasks:
                raise ValueError(f"task_kwargs has {name!r}, which is not in tasks={self.tasks}")
        if self.weights is not None:
            if len(self.weights) != len(self.tasks):
                raise ValueError(f"weights has {len(self.weights)} entries, tasks has {len(self.tasks)}")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError(f"weights={self.weights} must be >= 0 with a positive sum")
        if self.size <= 0:
            raise ValueError(f"size={self.size} must be > 0")
        if not 0 <= self.seed <= MAX_DATASET_SEED - len(self.tasks):
            raise ValueError(f"seed={self.seed} must be in [0, {MAX_DATASET_SEED - len(self.tasks)}]")


class TaskMixture:
    """Item `i` is a pure function of (config, i): the task is drawn with weights, the item by index."""

    def __init__(self, cfg: TaskMixConfig):
        self.cfg = cfg
        self.seeds = {name: cfg.seed + k for k, name in enumerate(cfg.tasks)}
        self.config_ids = {name: task_config_id(name, dict(cfg.task_kwargs.get(name, {}))) for name in cfg.tasks}
        self.datasets = {name: self._create(name, cfg.size, self.seeds[name]) for name in cfg.tasks}
        self._foreign: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        w = np.ones(len(cfg.tasks)) if cfg.weights is None else np.asarray(cfg.weights, dtype=np.float64)
        self.probs = w / w.sum()

    def _create(self, name: str, size: int, seed: int):
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **self.cfg.task_kwargs.get(name, {}))

    def __len__(self) -> int:
        return self.cfg.size

    def _item(self, ref: EntryRef, entry: dict[str, Any]) -> TaskItem:
        metadata = {k: v for k, v in entry["metadata"].items() if k not in _DROPPED_METADATA_KEYS}
        return TaskItem(ref.task, entry["question"], str(entry["answer"]), json_safe(metadata), ref)

    def __getitem__(self, index: int) -> TaskItem:
        rng = np.random.default_rng([self.cfg.seed, index])
        name = self.cfg.tasks[int(rng.choice(len(self.cfg.tasks), p=self.probs))]
        ref = EntryRef(name, self.config_ids[name], self.seeds[name], self.cfg.size, index % self.cfg.size)
        return self._item(ref, self.datasets[name][ref.index])

    def sample(self, n: int, rng: np.random.Generator) -> list[TaskItem]:
        return [self[int(i)] for i in rng.integers(0, len(self), size=n)]

    def rebuild(self, ref: EntryRef, question: str, max_size: int = 10_000_000) -> TaskItem:
        """The entry `ref` names, regenerated here with this node's config for its task.

        Raises `EntryMismatch` for a task outside this node's mixture, a different task config,
        an out-of-range address, or a question that is not the rebuilt one.
        """
        if ref.task not in self.datasets:
            raise EntryMismatch("task_not_in_mix", ref.task[:40])
        if ref.config != self.config_ids[ref.task]:
            raise EntryMismatch("task_config_mismatch", ref.task)
        if not (0 <= ref.seed <= MAX_DATASET_SEED and 0 < ref.size <= max_size and 0 <= ref.index < ref.size):
            raise EntryMismatch("entry_out_of_range", f"seed {ref.seed} size {ref.size} index {ref.index}")
        if (ref.seed, ref.size) == (self.seeds[ref.task], self.cfg.size):
            dataset = self.datasets[ref.task]
        else:  # a peer whose mixture lists this task at another position, or another size
            key = (ref.task, ref.seed, ref.size)
            if key not in self._foreign:
                try:
                    self._foreign[key] = self._create(ref.task, ref.size, ref.seed)
                except Exception as e:  # reasoning-gym's own validation of size/seed
                    raise EntryMismatch("entry_out_of_range", repr(e)[:80]) from None
                while len(self._foreign) > _MAX_FOREIGN_DATASETS:
                    self._foreign.popitem(last=False)
            self._foreign.move_to_end(key)
            dataset = self._foreign[key]
        entry = dataset[ref.index]
        if entry["question"] != question:
            raise EntryMismatch("question_mismatch", ref.task)
        return self._item(ref, entry)
