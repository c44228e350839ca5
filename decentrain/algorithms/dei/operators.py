"""Mutation operators: a language model that writes a new warrior or rewrites an elite.

Each DEI node names its own operator, so a swarm mixes model families and sizes:
- `transformers`: a local causal LM (a directory, a hub id, or a from-config model); on CPU the
  small models `dei_sft` trains on the shipped warriors. Small models follow no instruction, so
  they are prompted with a random prefix of the parent warrior and continue it (the named
  departure from DRQ's instruction prompts, which the endpoint operator keeps).
- `openai`: any OpenAI-compatible chat endpoint (vLLM, Ollama, an API), prompted with DRQ's
  instructions, the parent and the current opponents. The key is read from the environment
  variable the config names, sent only in the Authorization header, and never logged.

Every call is counted against the node's budget (`calls`); an operator asked past it returns
nothing. What a model answers is text for `redcode.parse`, nothing more.

Adding one: a class with `generate(prompts, rng) -> list[str]`, registered in OPERATORS, plus
its YAML under conf/dei/operator/.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from decentrain.core.registry import Registry
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer

log = logging.getLogger(__name__)

SYSTEM_PROMPT = ("You write Core War warriors in Redcode-94 (ICWS'94, core size 8000, at most 100 "
                 "instructions). Answer with one warrior in a ```redcode fenced block and nothing else.")
NEW_PROMPT = "Write a new, strong Redcode-94 warrior."
MUTATE_PROMPT = ("Improve this warrior so that it beats the opponents below. Keep what works; change "
                 "its strategy, constants or structure where that helps.")
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
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"operator.timeout_s={self.timeout_s} must be finite and > 0")
        if not isinstance(self.sft_steps, int) or self.sft_steps < 0:
            raise ValueError(f"operator.sft_steps={self.sft_steps!r} must be an integer >= 0")


@dataclass(frozen=True)
class Request:
    parent: str | None  # None: write a new warrior
    opponents: tuple[str, ...] = ()


class MutationOperator(Protocol):
    def generate(self, requests: list[Request], rng: np.random.Generator) -> list[str]: ...


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
            gen = self.model.generate(ids, do_sample=True, temperature=self.cfg.temperature,
                                      max_new_tokens=self.cfg.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id)
            out.append(prompt + self.tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
        return out


@OPERATORS.register("openai")
class ChatEndpoint:
    def __init__(self, cfg: OperatorConfig, device: torch.device, seed: int):
        self.cfg, self.seed = cfg, seed
        self._key = os.environ.get(cfg.api_key_env, "")

    def _messages(self, req: Request) -> list[dict[str, str]]:
        if req.parent is None:
            user = NEW_PROMPT
        else:
            opponents = "\n\n".join(f"Opponent {i + 1}:\n{o}" for i, o in enumerate(req.opponents))
            user = f"{MUTATE_PROMPT}\n\nWarrior:\n{req.parent}\n\n{opponents}".rstrip()
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def _call(self, req: Request) -> str:
        body = json.dumps({"model": self.cfg.endpoint_model, "messages": self._messages(req),
                           "temperature": self.cfg.temperature, "max_tokens": self.cfg.max_new_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        request = urllib.request.Request(self.cfg.base_url.rstrip("/") + "/chat/completions", body, headers)
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
        except OSError as e:  # refused, timed out, HTTP error: this call yields nothing
            log.warning("operator endpoint %s: %s", self.cfg.base_url, type(e).__name__)
            return ""
        return answer_text(raw[:MAX_ANSWER_BYTES])

    def generate(self, requests: list[Request], rng: np.random.Generator) -> list[str]:
        return [self._call(r) for r in requests]


def answer_text(raw: bytes) -> str:
    """The first choice's message text of a chat-completions answer, or "" for anything else (never raises)."""
    try:
        doc = json.loads(raw.decode("utf-8", errors="replace"))
        text = doc["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    return text if isinstance(text, str) else ""


class BudgetedOperator:
    """An operator that answers at most `calls` requests over the node's whole run, and counts them."""

    def __init__(self, operator: MutationOperator, calls: int):
        self.operator, self.left, self.used = operator, calls, 0

    def generate(self, requests: list[Request], rng: np.random.Generator) -> list[str]:
        requests = requests[: max(self.left, 0)]
        if not requests:
            return []
        self.left -= len(requests)
        self.used += len(requests)
        return self.operator.generate(requests, rng)


def build_operator(cfg: OperatorConfig, calls: int, device: torch.device, seed: int) -> BudgetedOperator:
    return BudgetedOperator(OPERATORS.get(cfg.name, field="operator.name")(cfg, device, seed), calls)
