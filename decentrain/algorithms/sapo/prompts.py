r"""Prompts and answers of a node: the plain template of byte-level models, and chat templates.

`template.chat=true` (an instruct model such as SmolLM2-135M-Instruct) puts `template.prompt` as the
user turn (after `template.system`, when set) into the tokenizer's own chat template, lets the model
answer in free text (`template.answer_format=final`, `final_answer`) and ends the turn on the model's
own end-of-turn token.

Completions travel between peers as text, and peers may use other tokenizers, so the end of a turn
travels as text too: `template.stop` (ChatML's "<|im_end|>" by default) is the swarm's end-of-turn
marker. A node decodes a completion that ended on its EOS token as its text followed by the marker
(`sampling.end_of_turn`), and `ChatTemplate.cut` turns the marker back into this node's own EOS
token text before anything is scored or trained, so the policy also learns where to stop. The cut
ends a completion at the first special-token text of this tokenizer (a peer's "<|im_start|>system"
is never trained as a role switch): only an end of turn survives, as this node's own.

`final_answer` reads the answer out of free-form text with fixed, bounded rules (no evaluation):
an <answer> tag or a \boxed{} when there is one, else the text after the last answer cue ("answer
is", "Answer:") or the last non-empty line, after its last "=" or "equals", unwrapped from markdown
and a closing period; what is still a sentence gives its last number, as lm-evaluation-harness's
`flexible-extract` does for GSM8K ("6 + 5 equals 11." -> 11, "There are 28 legs in total." -> 28),
or stays as it is when it holds none (a list of words). SmolLM2-135M-Instruct answers "What is 6 + 5?"
in prose, with or without an instruction to give the answer only (docs/sapo.md has its outputs).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from decentrain.algorithms.sapo.sampling import SamplingConfig
from decentrain.tasks import PromptTemplate, TemplateConfig
from decentrain.tasks.answers import ASCII_SPACE

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
# "the answer is", "final answer:", "Answer -", "result is" (the cue's own words only; ASCII)
_CUE = re.compile(r"(?:\banswer\b|\bresult\b)\s*(?:is|:|-|=)\s*", re.IGNORECASE | re.ASCII)
_EQUALS = re.compile(r"=|\bequals\b", re.ASCII)
_NUMBER = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?(?!\w)", re.ASCII)  # a number, not a word's digits (word_1)
_WORD = re.compile(r"[A-Za-z]{2,}")
_WRAPPERS = "*`\"' " + ASCII_SPACE  # markdown emphasis and code, quotes (not "_": words start with it)


class PlainTemplate(PromptTemplate):
    """`template.prompt` as text (byte-level models); "line" answers stop generation at `template.stop`."""

    def __init__(self, cfg: TemplateConfig, tokenizer: Any = None):
        super().__init__(cfg)

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        """The sampling settings generation runs with under this template."""
        return dataclasses.replace(sampling, stop=self.cfg.stop) if self.cfg.answer_format == "line" else sampling


class ChatTemplate(PromptTemplate):
    """The tokenizer's chat template around `template.prompt`; free-form answers; end of turn as `template.stop`."""

    def __init__(self, cfg: TemplateConfig, tokenizer: Any):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"template.chat=true needs a tokenizer with a chat template; {type(tokenizer).__name__} has none"
            )
        super().__init__(cfg)
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token
        # the first of these in a completion ends it: every special token of this tokenizer, and the marker
        specials = {t for t in tokenizer.all_special_tokens if t} | set(getattr(tokenizer, "added_tokens_encoder", {}))
        self._ends = re.compile("|".join(re.escape(t) for t in sorted(specials | {cfg.stop}, key=len, reverse=True)))
        self._turn_ends = {cfg.stop, self.eos}

    def __call__(self, question: str) -> str:
        messages = [{"role": "system", "content": self.cfg.system}] if self.cfg.system else []
        messages.append({"role": "user", "content": self.cfg.prompt.replace("{question}", question)})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        # the EOS token ends generation (no stop-string matching); a turn that ended carries the marker
        return dataclasses.replace(sampling, stop=None, end_of_turn=self.cfg.stop)

    def _split(self, completion: str) -> tuple[str, bool]:
        """(the text before the first special-token text, whether that token ended the turn)."""
        match = self._ends.search(completion)
        if match is None:
            return completion, False
        return completion[: match.start()], match.group() in self._turn_ends

    def cut(self, completion: str) -> str:
        body, ended = self._split(completion)
        return body + self.eos if ended else body

    def raw_answer(self, completion: str) -> str:
        return final_answer(self._split(completion)[0])

    def is_well_formed(self, completion: str) -> bool:
        """The model ended its turn and an answer can be read out of it."""
        return self._split(completion)[1] and self.extract_answer(completion) is not None


def build_template(cfg: TemplateConfig, tokenizer: Any) -> PromptTemplate:
    return (ChatTemplate if cfg.chat else PlainTemplate)(cfg, tokenizer)


def answer_target(template: PromptTemplate, answer: str) -> str:
    """What SFT teaches after the prompt: the answer and what ends it (a chat model's end-of-turn token,
    else the template's stop string)."""
    return answer + (template.eos if isinstance(template, ChatTemplate) else template.cfg.stop)


def final_answer(text: str) -> str:
    """The answer of a free-form completion (see the module docstring); "" when there is none."""
    if tags := _TAG.findall(text):
        return _unwrap(tags[-1])
    if boxed := _BOXED.findall(text):
        return _unwrap(boxed[-1])
    cues = list(_CUE.finditer(text))
    if cues:
        span = text[cues[-1].end() :].strip(ASCII_SPACE).split("\n", 1)[0]
    else:
        lines = [line for line in text.split("\n") if line.strip(ASCII_SPACE)]
        span = lines[-1] if lines else ""
    span = _unwrap(_EQUALS.split(span)[-1])
    if len(_WORD.findall(span)) >= 2 and (numbers := _NUMBER.findall(span)):
        return numbers[-1]  # a sentence: its last number
    return span


def _unwrap(span: str) -> str:
    """`span` without surrounding whitespace, markdown emphasis, quotes or a closing period."""
    span = span.strip(_WRAPPERS)
    while span.endswith((".", "!")) and not span.endswith(".."):
        span = span[:-1].rstrip(_WRAPPERS)
    return span
