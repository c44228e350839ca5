"""RL tasks: a reasoning-gym mixture, the prompt template and the verifier reward."""

from decentrain.tasks.mixture import TaskItem, TaskMixConfig, TaskMixture, json_safe, known_tasks
from decentrain.tasks.rewards import PromptTemplate, RewardConfig, TemplateConfig, Verifier

__all__ = [
    "PromptTemplate",
    "RewardConfig",
    "TaskItem",
    "TaskMixConfig",
    "TaskMixture",
    "TemplateConfig",
    "Verifier",
    "json_safe",
    "known_tasks",
]
