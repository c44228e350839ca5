"""Mutation operators: a language model that writes a new warrior or rewrites an elite.

Each DEI node names its own operator, so a swarm mixes model families and sizes:
- `transformers`: a local causal LM (a directory, a hub id, or a from-config model); on CPU the
  small models `dei_sft` trains on the shipped warriors. Small models follow no instruction, so
  they are prompted with a random prefix of the parent warrior and continue it (the named
  departure from DRQ's instruction prompts, which the endpoint operator keeps).
- `openai`: any OpenAI-compatible chat endpoint (vLLM, Ollama, an API), prompted with DRQ's
  instructions, the parent and the current opponents, through `endpoint.post` (one deadline per
  call, no redirects). The key is read from the environment variable the config names, sent only
  in the Authorization header to the configured host, and never logged.

Every call is counted against the node's budget (`calls`); an operator asked past it returns
nothing. A call that fails, however it fails (the endpoint's error, timeout or garbage, or an
exception out of the operator), is None in the answers and counted by reason in
`BudgetedOperator.failure_counts`: it costs the node that call, not the run. What a model
answers is text for `redcode.parse`, nothing more.

Adding one: a class with `generate(requests, rng) -> list[str | None]` (and, optionally, a
classmethod `check(cfg)` run before any node starts), registered in OPERATORS.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from decentrain.algorithms.dei.endpoint import CallFailed, check_url, post, where
from decentrain.core.registry import Registry
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You write Core War warriors in Redcode-94 (ICWS'94, core size 8000, at most 100 "
    "instructions). Answer with one warrior in a ```redcode fenced block and nothing else."
)
NEW_PROMPT = "Write a new, strong Redcode-94 warrior."
MUTATE_PROMPT = (
    "Improve this warrior so that it beats the opponents below. Keep what works; change "
    "its strategy, constants or structure where that helps."
)
MAX_ANSWER_BYTES = 32_000  # an endpoint's answer is cut here before anything reads it


@dataclass
class OperatorConfig:
    name: str = "transformers"  # transformers | openai
    model: ModelConfig = field(default_factory=ModelConfig)  # transformers: the local model
    max_new_tokens: int = 384
    temperature: float = 1.0
    # transformers: how many of the parent's lines (inclusive range) open the prompt
    prefix_lines: list[int] = field(default_factory=lambda: [1, 4])
    base_url: str = "http://127.0.0.1:8000/v1"  # openai: the endpoint
    endpoint_model: str = ""  # openai: the model name sent to the endpoint
    api_key_env: str = "OPENAI_API_KEY"  # openai: the environment variable holding the key (may be unset)
    timeout_s: float = 60.0
    # transformers with no `model.pretrained`: train the from-config model on the shipped warriors
    # for this many steps first (`sft.py`; cached in the node's run dir), 0 to search with it untrained
    sft_steps: int = 200

    def __post_init__(self) -> None:
        OPERATORS.get(self.name, field="operator.name")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= 4096:
            raise ValueError(f"operator.max_new_tokens={self.max_new_tokens!r} must be in [1, 4096]")
        if not 0 < self.temperature <= 10:
            raise ValueError(f"operator.temperature={self.temperature} must be in (0, 10]")
        if len(self.prefix_lines) != 2 or not 0 <= self.prefix_lines[0] <= self.prefix_lines[1]:
            raise ValueError(f"operator.prefix_lines={list(self.prefix_lines)} must be 0 <= lo <= hi")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 3600):
            raise ValueError(f"operator.timeout_s={self.timeout_s} must be in (0, 3600]")
        check_url(self.base_url, "operator.base_url")
        for name in ("endpoint_model", "api_key_env"):
            if not isinstance(getattr(self, name), str) or len(getattr(self, name)) > 256:
                raise ValueError(f"operator.{name} must be a string of at most 256 characters")
        if not isinstance(self.sft_steps, int) or self.sft_steps < 0:
            raise ValueError(f"operator.sft_steps={self.sft_steps!r} must be an integer >= 0")


@dataclass(frozen=True)
class Request:
    parent: str | None  # None: write a new warrior
    opponents: tuple[str, ...] = ()


class MutationOperator(Protocol):
    def generate(self, requests: list[Request], rng: np.random.Generator) -> list[str | None]: ...


OPERATORS: Registry[type] = Registry("operator")


@OPERATORS.register("transformers")
class LocalLM:
    def __init__(self, cfg: OperatorConfig, device: torch.device, seed: int):
        self.cfg = cfg
        self.tokenizer = build_tokenizer(cfg.model)
        self.model = build_model(cfg.model, self.tokenizer).to(device).eval()
        self.device = device
        torch.manual_seed(seed)

    def _prompt(self, req: Request, rng: np.random.Generator) -> str:
        if req.parent is None:
            return ";redcode-94\n"
        body = [ln for ln in req.parent.splitlines() if ln and not ln.startswith(";") and not ln.startswith("ORG")]
        lo, hi = self.cfg.prefix_lines
        keep = int(rng.integers(lo, hi + 1))
        return ";redcode-94\n" + "".join(ln + "\n" for ln in body[:keep])

    @torch.no_grad()
    def generate(self, requests: list[Request], rng: np.random.Generator) -> list[str]:
        prompts = [self._prompt(r, rng) for r in requests]
        out = []
        for prompt in prompts:  # one at a time: tiny models, no padding to get wrong
            ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids.to(self.device)
            gen = self.model.generate(
                ids,
                do_sample=True,
                temperature=self.cfg.temperature,
                max_new_tokens=self.cfg.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            out.append(prompt + self.tokenizer.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
        return out


@OPERATORS.register("openai")
class ChatEndpoint:
    def __init__(self, cfg: OperatorConfig, device: torch.device, seed: int):
        self.check(cfg)
        self.cfg, self.seed = cfg, seed
        self._key = os.environ.get(cfg.api_key_env, "")
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        self.failures: Counter[str] = Counter()

    @classmethod
    def check(cls, cfg: OperatorConfig) -> None:
        """The key, if set, fits in a header (said without the key, before any node starts)."""
        key = os.environ.get(cfg.api_key_env, "")
        if key and not all(0x21 <= ord(c) <= 0x7E for c in key):
            raise ValueError(f"operator.api_key_env: ${cfg.api_key_env} holds characters a header cannot carry")

    def _messages(self, req: Request) -> list[dict[str, str]]:
        if req.parent is None:
            user = NEW_PROMPT
        else:
            opponents = "\n\n".join(f"Opponent {i + 1}:\n{o}" for i, o in enumerate(req.opponents))
            user = f"{MUTATE_PROMPT}\n\nWarrior:\n{req.parent}\n\n{opponents}".rstrip()
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def _call(self, req: Request) -> str:
        body = json.dumps(
            {
                "model": self.cfg.endpoint_model,
                "messages": self._messages(req),
                "temperature": self.cfg.temperature,
                "max_tokens": self.cfg.max_new_tokens,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        text = answer_text(post(self.url, body, headers, self.cfg.timeout_s, MAX_ANSWER_BYTES))
        if text is None:
            raise CallFailed("not_an_answer")
        return text

    def generate(self, requests: list[Request], rng: np.random.Generator) -> list[str | None]:
        out: list[str | None] = []
        for req in requests:
            try:
                out.append(self._call(req))
            except CallFailed as e:
                self.failures[e.reason] += 1
                log.warning("operator endpoint %s: call failed: %s", where(self.cfg.base_url), e)
                out.append(None)
        return out


def answer_text(raw: bytes) -> str | None:
    """The first choice's message text of a chat-completions answer, or None for anything else (never raises)."""
    try:
        doc = json.loads(raw.decode("utf-8", errors="replace"))
        text = doc["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):  # RecursionError: "[" * 32000
        return None
    return text if isinstance(text, str) else None


class BudgetedOperator:
    """An operator that answers at most `calls` requests over the node's whole run, and counts them.

    A call that fails is None in the answers; an exception out of the operator fails the calls it
    was given (logged, counted under `raised/<type>`) and the node goes on with its next call.
    """

    def __init__(self, operator: MutationOperator, calls: int):
        self.operator, self.left, self.used, self.failed = operator, calls, 0, 0
        self.raised: Counter[str] = Counter()

    def generate(self, requests: list[Request], rng: np.random.Generator) -> list[str | None]:
        requests = requests[: max(self.left, 0)]
        if not requests:
            return []
        self.left -= len(requests)
        self.used += len(requests)
        try:
            answers = list(self.operator.generate(requests, rng))
        except Exception as e:  # noqa: BLE001 -- whatever the model stack raised, it costs these calls only
            log.warning(
                "operator %s failed on %d call(s): %s",
                type(self.operator).__name__,
                len(requests),
                type(e).__name__,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            self.raised[f"raised/{type(e).__name__}"] += len(requests)
            answers = []
        answers = [a if isinstance(a, str) else None for a in answers[: len(requests)]]
        answers += [None] * (len(requests) - len(answers))
        self.failed += answers.count(None)
        return answers

    def failure_counts(self) -> Counter[str]:
        """Failed calls by reason: the operator's own (an endpoint's) and exceptions raised out of it."""
        return self.raised + Counter(getattr(self.operator, "failures", {}))


def check_operator(cfg: OperatorConfig) -> None:
    """The operator's own check of what its config cannot say alone (the environment), if it has one."""
    check = getattr(OPERATORS.get(cfg.name, field="operator.name"), "check", None)
    if check is not None:
        check(cfg)


def build_operator(cfg: OperatorConfig, calls: int, device: torch.device, seed: int) -> BudgetedOperator:
    return BudgetedOperator(OPERATORS.get(cfg.name, field="operator.name")(cfg, device, seed), calls)
