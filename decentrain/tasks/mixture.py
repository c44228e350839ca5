"""A weighted mixture of reasoning-gym tasks, addressed by index so every node can rebuild it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import reasoning_gym
from reasoning_gym.factory import DATASETS

# Keys of reasoning-gym metadata that no `score_answer` reads; `difficulty` holds tuples.
_DROPPED_METADATA_KEYS = frozenset({"difficulty"})


def known_tasks() -> list[str]:
    return sorted(DATASETS)


def check_task_name(name: str, field_name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"{field_name}={name!r} is unknown; allowed: {known_tasks()}")


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
        for name in self.tasks:
            check_task_name(name, "tasks")
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


class TaskMixture:
    """Item `i` is a pure function of (config, i): the task is drawn with weights, the item by index."""

    def __init__(self, cfg: TaskMixConfig):
        self.cfg = cfg
        self.datasets = {
            name: reasoning_gym.create_dataset(name, size=cfg.size, seed=cfg.seed + k, **cfg.task_kwargs.get(name, {}))
            for k, name in enumerate(cfg.tasks)
        }
        w = np.ones(len(cfg.tasks)) if cfg.weights is None else np.asarray(cfg.weights, dtype=np.float64)
        self.probs = w / w.sum()

    def __len__(self) -> int:
        return self.cfg.size

    def __getitem__(self, index: int) -> TaskItem:
        rng = np.random.default_rng([self.cfg.seed, index])
        name = self.cfg.tasks[int(rng.choice(len(self.cfg.tasks), p=self.probs))]
        entry = self.datasets[name][index % self.cfg.size]
        metadata = {k: v for k, v in entry["metadata"].items() if k not in _DROPPED_METADATA_KEYS}
        return TaskItem(name, entry["question"], str(entry["answer"]), json_safe(metadata))

    def sample(self, n: int, rng: np.random.Generator) -> list[TaskItem]:
        return [self[int(i)] for i in rng.integers(0, len(self), size=n)]
