"""Held-out greedy accuracy of a policy: the learning signal the SAPO benchmarks gate on.

Training reward mixes in peers' groups and moves with the sampling temperature; greedy exact
accuracy on a fixed set of questions from other dataset seeds does neither. Small tasks draw
from a small question space (1-digit sums), so "held-out" means other draws, not unseen questions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from decentrain.algorithms.sapo.generation import HFGenerationBackend, SamplingConfig
from decentrain.tasks import PromptTemplate, RewardConfig, TaskItem, TaskMixConfig, TaskMixture, Verifier


@dataclass
class RLEvalConfig:
    every: int = 0  # rounds between evaluations (also before round 1 and after the last); 0: off
    prompts_per_task: int = 64
    seed_offset: int = 1000  # held-out questions come from dataset seed task.seed + seed_offset + k

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"eval.every={self.every} must be >= 0")
        if self.prompts_per_task < 1:
            raise ValueError(f"eval.prompts_per_task={self.prompts_per_task} must be >= 1")


def heldout_items(task_cfg: TaskMixConfig, prompts_per_task: int, seed_offset: int) -> dict[str, list[TaskItem]]:
    """The first `prompts_per_task` entries of each task's dataset at a seed training never uses."""
    out = {}
    for task in task_cfg.tasks:
        cfg = TaskMixConfig(
            tasks=[task],
            size=prompts_per_task,
            seed=task_cfg.seed + seed_offset,
            task_kwargs={task: task_cfg.task_kwargs.get(task, {})},
        )
        mixture = TaskMixture(cfg)  # one task: item i is entry i
        out[task] = [mixture[i] for i in range(prompts_per_task)]
    return out


def greedy_accuracy(
    model: Any, tokenizer: Any, template: PromptTemplate, sampling: SamplingConfig, items: dict[str, list[TaskItem]]
) -> dict[str, float]:
    """Exact-answer accuracy of greedy decoding per task, and their mean under "mean"."""
    backend = HFGenerationBackend(model, tokenizer, dataclasses.replace(sampling, temperature=0.0))
    verifier = Verifier(template, RewardConfig(kind="exact"))
    out = {}
    try:
        for task, its in items.items():
            completions = backend.generate([template(it.question) for it in its], 1, seed=0)
            out[task] = float(np.mean([verifier.scores(it, c)[0] >= 1.0 for it, c in zip(its, completions)]))
    finally:
        verifier.close()
    out["mean"] = float(np.mean(list(out.values())))
    return out
