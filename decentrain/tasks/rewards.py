"""Prompt template, answer extraction and the verifier reward (pure parsers, `answers.py`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from decentrain.core.registry import Registry
from decentrain.tasks.answers import ASCII_SPACE, Malformed, score
from decentrain.tasks.mixture import TaskItem, check_task_name
from decentrain.tasks.vetted import check_vetted

ANSWER_FORMATS = ("line", "tag", "final")  # final: free-form chat answers (algorithms/sapo/prompts.py)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Whitespace characters allowed on either side of an answer; more is malformed. Padding scores
# nothing, but would be trained with the answer's advantage ("60 spaces + -4" scored 1.0).
MAX_ANSWER_PADDING = 8


@dataclass
class TemplateConfig:
    # Short on purpose: tiny byte-level models spend their context on the question, not on instructions.
    prompt: str = "Q: {question}\nA: "
    # "line": the answer is the completion up to `stop`; "tag": the text inside <answer>...</answer>.
    answer_format: str = "line"
    stop: str = "\n"
    # Instruct models: `prompt` is the user turn of the tokenizer's chat template (after `system`, if set),
    # answers are free-form ("final") and `stop` is the end-of-turn marker (algorithms/sapo/prompts.py).
    chat: bool = False
    system: str | None = None

    def __post_init__(self) -> None:
        if "{question}" not in self.prompt:
            raise ValueError(f"prompt={self.prompt!r} must contain '{{question}}'")
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"answer_format={self.answer_format!r} is unknown; allowed: {list(ANSWER_FORMATS[:2])}"
                " (and 'final' with chat=true)"
            )
        if self.chat != (self.answer_format == "final"):
            raise ValueError(
                f"answer_format={self.answer_format!r} with chat={self.chat}: chat templates take "
                "free-form answers (answer_format='final') and only they do"
            )
        if self.answer_format == "line" and not self.stop:
            raise ValueError("stop must be non-empty when answer_format='line'")


class PromptTemplate:
    def __init__(self, cfg: TemplateConfig):
        if cfg.chat and type(self) is PromptTemplate:
            raise ValueError("template.chat=true needs the tokenizer: algorithms.sapo.prompts.build_template")
        self.cfg = cfg

    def __call__(self, question: str) -> str:
        # str.replace, not str.format: questions may contain braces.
        return self.cfg.prompt.replace("{question}", question)

    def raw_answer(self, completion: str) -> str:
        """The answer's text as written, padding included."""
        if self.cfg.answer_format == "tag":
            match = _ANSWER_TAG.search(completion)
            return match.group(1) if match else ""
        return completion.split(self.cfg.stop, 1)[0]

    def extract_answer(self, completion: str) -> str | None:
        # ASCII spaces only: str.strip() also removes U+2003 & co, which reasoning-gym's scorers keep
        answer = self.raw_answer(completion).strip(ASCII_SPACE)
        return answer or None

    def padding(self, completion: str) -> int:
        """The longer run of whitespace on either side of the answer."""
        raw = self.raw_answer(completion)
        return max(len(raw) - len(raw.lstrip(ASCII_SPACE)), len(raw) - len(raw.rstrip(ASCII_SPACE)))

    def cut(self, completion: str) -> str:
        """The completion up to the end of its answer: through the first stop string (line) or the
        first closing tag (tag). Text after it is neither scored nor trained."""
        if self.cfg.answer_format == "tag":
            match = _ANSWER_TAG.search(completion)
            return completion[: match.end()] if match else completion
        i = completion.find(self.cfg.stop)
        return completion if i < 0 else completion[: i + len(self.cfg.stop)]

    def is_well_formed(self, completion: str) -> bool:
        """An answer that is closed: the stop string (or closing tag) follows it, so the model stopped on purpose."""
        if self.cfg.answer_format == "tag":
            return _ANSWER_TAG.search(completion) is not None and bool(self.extract_answer(completion))
        return self.cfg.stop in completion and self.extract_answer(completion) is not None


# How a verifier score in [0, 1] becomes the correctness reward.
REWARD_KINDS: Registry[Callable[[float], float]] = Registry("reward.kind")


@REWARD_KINDS.register("exact")
def exact_reward(score: float) -> float:
    """No partial credit: reasoning-gym gives some wrong answers 0.01-0.75 (basic_arithmetic scores "56"
    for "6" 0.5), and group scaling turns a 0/0.5 group into full +-1 advantages for a wrong answer."""
    return float(score >= 1.0)


@REWARD_KINDS.register("verifier")
def verifier_reward(score: float) -> float:
    """The task's own score_answer, partial credit kept."""
    return score


@dataclass
class RewardConfig:
    kind: str = "exact"  # a REWARD_KINDS name
    format_weight: float = 0.0  # added to the verifier reward for a well-formed completion

    def __post_init__(self) -> None:
        REWARD_KINDS.get(self.kind, field="reward.kind")
        if self.format_weight < 0:
            raise ValueError(f"format_weight={self.format_weight} must be >= 0")


class Verifier:
    """Scores completions for vetted reasoning-gym tasks with the pure parsers of `answers.py`.

    The item must be trusted: built by this node's mixture, or rebuilt by it from a peer's entry
    address (`TaskMixture.rebuild`); only completions come from peers, and they are parsed as
    data, never evaluated. `malformed` counts answers that did not parse in their task's format.
    """

    def __init__(self, template: PromptTemplate, cfg: RewardConfig | None = None):
        self.template = template
        self.cfg = cfg or RewardConfig()
        self.malformed = 0

    def scores(self, item: TaskItem, completions: Sequence[str]) -> list[float]:
        """Correctness in [0, 1] of each completion (format reward not included)."""
        check_task_name(item.task, "task")
        check_vetted(item.task, "task")
        entry = {"question": item.question, "answer": item.answer, "metadata": item.metadata}
        out = []
        for completion in completions:
            try:
                if self.template.padding(completion) > MAX_ANSWER_PADDING:
                    raise Malformed("answer padded with whitespace")
                out.append(score(item.task, self.template.extract_answer(completion), entry))
            except Malformed:
                self.malformed += 1
                out.append(0.0)
        return out

    def correctness(self, item: TaskItem, completion: str) -> float:
        return self.scores(item, [completion])[0]

    def rewards(self, item: TaskItem, completions: Sequence[str]) -> list[float]:
        """Correctness (per `kind`) plus `format_weight` for each well-formed completion."""
        to_reward = REWARD_KINDS.get(self.cfg.kind, field="reward.kind")
        out = [to_reward(s) for s in self.scores(item, completions)]
        if self.cfg.format_weight:
            out = [
                r + self.cfg.format_weight * float(self.template.is_well_formed(c)) for r, c in zip(out, completions)
            ]
        return out

    def __call__(self, item: TaskItem, completion: str) -> float:
        return self.rewards(item, [completion])[0]

    def close(self) -> None:
        """Nothing to release (kept so callers can treat verifiers uniformly)."""
