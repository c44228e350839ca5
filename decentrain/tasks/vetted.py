"""The tasks a mixture may use, and where each one's verifier runs.

A verifier scores text that a peer wrote (its completions), so a task is only allowed once its
`score_answer` has been read:
  in_process  the code path evaluates nothing (string compares, regex, Decimal); it runs here
  sandbox     it calls `eval` or sympy's `parse_expr` on model text; it runs in a locked-down
              subprocess (decentrain/tasks/sandbox.py), never in the node's interpreter

In-process entries pin the function that was read (its qualified name): a reasoning-gym release
that swaps in another `score_answer` is refused rather than trusted
(tests/unit/test_task_security.py also greps the pinned sources for eval/exec/sympy).
"""

from __future__ import annotations

from reasoning_gym.factory import DATASETS

IN_PROCESS = "in_process"
SANDBOX = "sandbox"

# task -> (mode, qualified name of the vetted score_answer)
VETTED_TASKS: dict[str, tuple[str, str]] = {
    "basic_arithmetic": (IN_PROCESS, "ProceduralDataset.score_answer"),  # exact or substring compare
    "leg_counting": (IN_PROCESS, "ProceduralDataset.score_answer"),
    "chain_sum": (IN_PROCESS, "ChainSumDataset.score_answer"),  # Decimal(answer) compare
    "word_sorting": (IN_PROCESS, "WordSortingDataset.score_answer"),  # regex split, list compare
    # eval(answer) on the completion:
    "string_insertion": (SANDBOX, "StringInsertionDataset.score_answer"),
    "spiral_matrix": (SANDBOX, "SpiralMatrixDataset.score_answer"),
    "binary_matrix": (SANDBOX, "BinaryMatrixDataset.score_answer"),
    # eval(entry["answer"]) as a fallback; the entry is rebuilt locally, sandboxed all the same:
    "number_sorting": (SANDBOX, "NumberSortingDataset.score_answer"),
    # sympy.parse_expr(answer), which evaluates Python:
    "polynomial_multiplication": (SANDBOX, "PolynomialMultiplicationDataset.score_answer"),
}


def vetted_tasks() -> list[str]:
    return sorted(VETTED_TASKS)


def check_vetted(name: object, field_name: str) -> str:
    """The task's verifier mode; a one-line ValueError for a task that is not vetted."""
    if not isinstance(name, str) or name not in VETTED_TASKS:
        raise ValueError(f"{field_name}={name!r} is not a vetted task; allowed: {vetted_tasks()}")
    if name not in DATASETS:
        raise ValueError(f"{field_name}={name!r} is not in this reasoning-gym install; allowed: "
                         f"{[t for t in vetted_tasks() if t in DATASETS]}")
    return verifier_mode(name)


def verifier_mode(name: str) -> str:
    """Where `name`'s verifier runs: in-process only if reasoning-gym still has the function read."""
    mode, qualname = VETTED_TASKS[name]
    if mode == IN_PROCESS and DATASETS[name][0].score_answer.__qualname__ != qualname:
        return SANDBOX  # a changed verifier is not trusted in-process
    return mode
