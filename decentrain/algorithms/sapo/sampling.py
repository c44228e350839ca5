"""What every generation backend shares: the `sampling` config, the backend interface and registry.

A module of its own so that `vllm_backend.py` needs nothing from `generation.py`, which imports it
to register `vllm` beside its own `hf`: no import cycle between the two backends.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Protocol

import torch

from decentrain.core.registry import Registry

GEN_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CACHES = ("auto", "dynamic", "static")
BACKENDS = ("hf", "vllm")


@dataclass
class SamplingConfig:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    # None/0: off, as in TRL. transformers would otherwise apply its generation default (top_k=50).
    top_k: int | None = None
    stop: str | None = "\n"  # each completion is cut just after the first stop string
    # Chat models: the text a completion that ended on the model's EOS / end-of-turn token carries in its
    # place (the swarm's end-of-turn marker; set from template.stop by a chat template). None: EOS ends silently.
    end_of_turn: str | None = None
    batch_size: int = 64  # sequences per `generate` call
    backend: str = "hf"  # hf | vllm (needs the vllm package)
    dtype: str = "auto"  # weights generation runs in; auto: bfloat16 on CUDA, the model's own dtype elsewhere
    cache: str = "auto"  # KV cache: static (compiled decode on CUDA) | dynamic; auto: static on CUDA

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 or null: off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.backend not in BACKENDS:
            raise ValueError(f"sampling.backend={self.backend!r} is unknown; allowed: {list(BACKENDS)}")
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ValueError("sampling.backend='vllm' needs the vllm package (pip install vllm); or use 'hf'")
        if self.dtype not in GEN_DTYPES:
            raise ValueError(f"sampling.dtype={self.dtype!r} is unknown; allowed: {list(GEN_DTYPES)}")
        if self.cache not in CACHES:
            raise ValueError(f"sampling.cache={self.cache!r} is unknown; allowed: {list(CACHES)}")


# Per prompt, G completions and for each the sampler's log-probs of its tokens (None: not available).
Scored = tuple[list[list[str]], list[list[tuple[float, ...] | None]]]


class GenerationBackend(Protocol):
    """Returns, for each prompt, `num_generations` completion strings (the prompt not included).

    `generate_scored` also returns the log-prob the sampling policy gave each token of each
    completion, in this tokenizer (what a peer's `loss.external_is` corrects against).
    """

    def generate(
        self,
        prompts: list[str],
        num_generations: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
    ) -> list[list[str]]: ...

    def generate_scored(
        self,
        prompts: list[str],
        num_generations: int,
        seed: int,
    ) -> Scored: ...


GENERATION_BACKENDS: Registry[type] = Registry("sampling.backend")


def cut_at_stop(text: str, stop: str | None) -> str:
    """`text` up to and including the first `stop` (the whole text without one)."""
    if stop and (i := text.find(stop)) >= 0:
        return text[: i + len(stop)]
    return text
