"""Prompt template, answer extraction and the verifier reward (reasoning-gym's `score_answer`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from reasoning_gym.factory import DATASETS

from decentrain.tasks.mixture import TaskItem, check_task_name

ANSWER_FORMATS = ("line", "tag")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass
class TemplateConfig:
    # Short on purpose: tiny byte-level models spend their context on the question, not on instructions.
    prompt: str = "Q: {question}\nA: "
    # "line": the answer is the completion up to `stop`; "tag": the text inside <answer>...</answer>.
    answer_format: str = "line"
    stop: str = "\n"

    def __post_init__(self) -> None:
        if "{question}" not in self.prompt:
            raise ValueError(f"prompt={self.prompt!r} must contain '{{question}}'")
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format={self.answer_format!r} is unknown; allowed: {list(ANSWER_FORMATS)}")
        if self.answer_format == "line" and not self.stop:
            raise ValueError("stop must be non-empty when answer_format='line'")


class PromptTemplate:
    def __init__(self, cfg: TemplateConfig):
        self.cfg = cfg

    def __call__(self, question: str) -> str:
        # str.replace, not str.format: questions may contain braces.
        return self.cfg.prompt.replace("{question}", question)

    def extract_answer(self, completion: str) -> str | None:
        if self.cfg.answer_format == "tag":
            match = _ANSWER_TAG.search(completion)
            answer = match.group(1).strip() if match else ""
        else:
            answer = completion.split(self.cfg.stop, 1)[0].strip()
        return answer or None

    def is_well_formed(self, completion: str) -> bool:
        """An answer that is closed: the stop string (or closing tag) follows it, so the model stopped on purpose."""
        if self.cfg.answer_format == "tag":
            return _ANSWER_TAG.search(completion) is not None and bool(self.extract_answer(completion))
        return self.cfg.stop in completion and self.extract_answer(completion) is not None


@dataclass
class RewardConfig:
    format_weight: float = 0.0  # added to the verifier reward for a well-formed completion

    def __post_init__(self) -> None:
        if self.format_weight < 0:
            raise ValueError(f"format_weight={self.format_weight} must be >= 0")


class Verifier:
    """Scores a completion for any reasoning-gym task: peers may send tasks outside this node's mix."""

    def __init__(self, template: PromptTemplate, cfg: RewardConfig | None = None):
        self.template = template
        self.cfg = cfg or RewardConfig()
        self._score_fns: dict[str, Callable[[str | None, dict[str, Any]], float]] = {}

    def _score_fn(self, task: str) -> Callable[[str | None, dict[str, Any]], float]:
        if task not in self._score_fns:
            check_task_name(task, "task")
            dataset_cls, config_cls = DATASETS[task]
            try:
                self._score_fns[task] = dataset_cls(config=config_cls(size=1)).score_answer
            except Exception as e:  # e.g. `composite`, which needs sub-datasets
                raise ValueError(f"task={task!r} has no standalone verifier: {e!r}") from e
        return self._score_fns[task]

    def correctness(self, item: TaskItem, completion: str) -> float:
        score_answer = self._score_fn(item.task)
        entry = {"question": item.question, "answer": item.answer, "metadata": item.metadata}
        try:
            score = float(score_answer(self.template.extract_answer(completion), entry))
        except Exception:  # metadata may come from a peer; a verifier that chokes on it scores 0
            return 0.0
        return min(max(score, 0.0), 1.0) if score == score else 0.0  # clamp; NaN scores 0

    def __call__(self, item: TaskItem, completion: str) -> float:
        reward = self.correctness(item, completion)
        if self.cfg.format_weight:
            reward += self.cfg.format_weight * float(self.template.is_well_formed(completion))
        return reward
