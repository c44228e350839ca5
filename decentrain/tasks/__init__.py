"""RL tasks: a reasoning-gym mixture, the prompt template, the verifier reward and the vetted task list."""

from decentrain.tasks.answers import MAX_ANSWER_CHARS, Malformed
from decentrain.tasks.mixture import (
    REBUILD_DROP_REASONS,
    EntryMismatch,
    EntryRef,
    TaskItem,
    TaskMixConfig,
    TaskMixture,
    json_safe,
    known_tasks,
    task_config_id,
)
from decentrain.tasks.rewards import PromptTemplate, RewardConfig, TemplateConfig, Verifier
from decentrain.tasks.vetted import VETTED_TASKS, vetted_tasks

__all__ = [
    "MAX_ANSWER_CHARS",
    "REBUILD_DROP_REASONS",
    "VETTED_TASKS",
    "EntryMismatch",
    "EntryRef",
    "Malformed",
    "PromptTemplate",
    "RewardConfig",
    "TaskItem",
    "TaskMixConfig",
    "TaskMixture",
    "TemplateConfig",
    "Verifier",
    "json_safe",
    "known_tasks",
    "task_config_id",
    "vetted_tasks",
]
