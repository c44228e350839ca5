"""Sampling G completions per prompt behind a small backend interface, and completion log-probs.

Backends (`sampling.backend`): `hf` (transformers `generate`, here) and `vllm` (sapo/vllm_backend.py,
optional). On CUDA the HF backend generates from a bf16 copy of the policy, refreshed from the trained
weights before each call, with a static KV cache, which transformers compiles (`torch.compile` of
the decode step) on CUDA; prompt widths and batch rows are padded to fixed sizes so the compiled
step sees a few shapes only.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from decentrain.core.registry import Registry

GEN_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CACHES = ("auto", "dynamic", "static")
BACKENDS = ("hf", "vllm")
PROMPT_WIDTH_MULTIPLE = 64  # static cache: left-pad prompts to a multiple of this (fewer distinct shapes)


@dataclass
class SamplingConfig:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    # None/0: off, as in TRL. transformers would otherwise apply its generation default (top_k=50).
    top_k: int | None = None
    stop: str | None = "\n"  # each completion is cut just after the first stop string
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


class GenerationBackend(Protocol):
    """Returns, for each prompt, `num_generations` completion strings (the prompt not included)."""

    def generate(
        self,
        prompts: list[str],
        num_generations: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
    ) -> list[list[str]]: ...


GENERATION_BACKENDS: Registry[type] = Registry("sampling.backend")


def build_generation_backend(model: Any, tokenizer: Any, cfg: SamplingConfig) -> GenerationBackend:
    if cfg.backend == "vllm":
        from decentrain.algorithms.sapo import vllm_backend  # noqa: F401 (registers it; imports vllm lazily)
    return GENERATION_BACKENDS.get(cfg.backend, field="sampling.backend")(model, tokenizer, cfg)


def _cut_at_stop(text: str, stop: str | None) -> str:
    if stop and (i := text.find(stop)) >= 0:
        return text[: i + len(stop)]
    return text


def clip_to_tokens(text: str, tokenizer: Any, max_tokens: int) -> str:
    """The longest prefix of `text` that `tokenizer` encodes in at most `max_tokens` tokens.

    A receiver cuts peers' completions (and its own) to its own generation cap with this, before
    scoring and before training, so the text scored is exactly the text trained.
    """
    def length(t: str) -> int:
        return len(tokenizer(t, add_special_tokens=False)["input_ids"])

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    decoded = tokenizer.decode(ids[:max_tokens], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    # decoding need not give a prefix back (a split multi-byte character decodes to U+FFFD)
    n = len(os.path.commonprefix([decoded, text]))
    while n and length(text[:n]) > max_tokens:
        n -= 1
    return text[:n]


def sampling_kwargs(cfg: SamplingConfig, temperature: float, top_p: float, tokenizer: Any) -> dict[str, Any]:
    """`generate`'s sampling arguments, in one place (greedy when temperature is 0)."""
    kwargs: dict[str, Any] = dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature > 0 else {}
    if temperature > 0:  # 0 switches top-k off: transformers would apply its default top_k=50 (TRL's is off)
        kwargs["top_k"] = cfg.top_k or 0
    if cfg.stop:  # lets a batch end early once every row has stopped
        kwargs.update(stop_strings=[cfg.stop], tokenizer=tokenizer)
    return kwargs


def generation_dtype(cfg: SamplingConfig, model: Any, device: torch.device) -> torch.dtype:
    model_dtype = next(model.parameters()).dtype
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else model_dtype
    return GEN_DTYPES[cfg.dtype]


@GENERATION_BACKENDS.register("hf")
class HFGenerationBackend:
    """transformers `generate` with a KV cache, batched over prompts x generations, left-padded."""

    def __init__(self, model: Any, tokenizer: Any, cfg: SamplingConfig | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg or SamplingConfig()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._copy: Any = None  # the generation copy, when it differs in dtype from the trained model

    def rollout_model(self, device: torch.device) -> Any:
        """The module `generate` runs: the policy itself, or a copy in the generation dtype that is
        refreshed from the trained weights first (an O(params) cast, small beside decoding)."""
        dtype = generation_dtype(self.cfg, self.model, device)
        if dtype == next(self.model.parameters()).dtype:
            return self.model
        if self._copy is None:
            self._copy = copy.deepcopy(self.model).to(dtype).eval().requires_grad_(False)
        with torch.no_grad():
            for mine, theirs in zip(self._copy.parameters(), self.model.parameters(), strict=True):
                mine.copy_(theirs)
        return self._copy

    def static_cache(self, device: torch.device) -> bool:
        return self.cfg.cache == "static" or (self.cfg.cache == "auto" and device.type == "cuda")

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        num_generations: int,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int = 0,
    ) -> list[list[str]]:
        cfg = self.cfg
        max_new_tokens = cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
        temperature = cfg.temperature if temperature is None else temperature
        top_p = cfg.top_p if top_p is None else top_p
        kwargs = sampling_kwargs(cfg, temperature, top_p, self.tokenizer)

        # Prompt-major order: the G copies of a prompt are adjacent, so groups come out contiguous.
        flat = [p for p in prompts for _ in range(num_generations)]
        device = next(self.model.parameters()).device
        model = self.rollout_model(device)
        static = self.static_cache(device)
        if static:
            kwargs["cache_implementation"] = "static"
        texts: list[str] = []
        was_training = model.training
        model.eval()
        try:
            # A private RNG stream: sampling is reproducible per seed and leaves the global RNG alone.
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(seed)
                for start in range(0, len(flat), cfg.batch_size):
                    batch = flat[start : start + cfg.batch_size]
                    # a static cache is compiled per shape: a short last batch is filled up with
                    # copies of its last prompt (their completions are dropped)
                    rows = batch + batch[-1:] * (cfg.batch_size - len(batch)) if static else batch
                    texts += self._generate_batch(model, rows, device, max_new_tokens, kwargs, static)[: len(batch)]
        finally:
            model.train(was_training)
        texts = [_cut_at_stop(t, cfg.stop) for t in texts]
        return [texts[i : i + num_generations] for i in range(0, len(texts), num_generations)]

    def _generate_batch(self, model: Any, prompts: list[str], device: torch.device, max_new_tokens: int,
                        kwargs: dict[str, Any], static: bool) -> list[str]:
        enc = self.tokenizer(
            prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt",
            pad_to_multiple_of=PROMPT_WIDTH_MULTIPLE if static else None,
        ).to(device)
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, use_cache=True, pad_token_id=self.pad_id, **kwargs
        )
        return self.tokenizer.batch_decode(out[:, enc["input_ids"].size(1) :], skip_special_tokens=True)


def completion_logprobs(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    micro_batch_size: int,
    temperature: float = 1.0,
) -> Tensor:
    """Per-token log-probs [N, C] of the completion tokens given [prompt | completion].

    Runs under the caller's grad mode (no_grad for old/ref log-probs, grad for the loss).
    Position ids follow the attention mask, so left padding does not shift positions.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    c = completion_ids.size(1)
    out = []
    for i in range(0, input_ids.size(0), micro_batch_size):
        sl = slice(i, i + micro_batch_size)
        # Only the last C+1 logits matter: position t predicts token t+1.
        logits = model(
            input_ids=input_ids[sl],
            attention_mask=attention_mask[sl],
            position_ids=position_ids[sl],
            logits_to_keep=c + 1,
            use_cache=False,
        ).logits[:, :-1].float()
        if temperature != 1.0:
            logits = logits / temperature
        logps = torch.gather(F.log_softmax(logits, dim=-1), 2, completion_ids[sl, :, None]).squeeze(-1)
        out.append(logps)
    return torch.cat(out, dim=0)
