"""The tasks a mixture may use: those with a pure scorer in decentrain/tasks/answers.py.

A verifier scores text that a stranger wrote, so a task is allowed only once its answer format
has a strict parser here that evaluates nothing. A task whose scoring cannot be made pure
(reasoning-gym's verifier needs an interpreter, e.g. arbitrary expressions) stays off this list
and is refused at config time.
"""

from __future__ import annotations

from reasoning_gym.factory import DATASETS

from decentrain.tasks.answers import SCORERS

VETTED_TASKS: tuple[str, ...] = tuple(SCORERS.names())


def vetted_tasks() -> list[str]:
    return list(VETTED_TASKS)


def check_vetted(name: object, field_name: str) -> None:
    """A one-line ValueError for a task that has no pure scorer (or is missing from reasoning-gym)."""
    if not isinstance(name, str) or name not in SCORERS:
        raise ValueError(
            f"{field_name}={name!r} is not a vetted task (no pure answer parser); allowed: {vetted_tasks()}"
        )
    if name not in DATASETS:
        raise ValueError(
            f"{field_name}={name!r} is not in this reasoning-gym install; allowed: "
            f"{[t for t in vetted_tasks() if t in DATASETS]}"
        )
