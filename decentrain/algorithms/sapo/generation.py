"""Sampling G completions per prompt behind a small backend interface, and completion log-probs.

Backends (`sampling.backend`): `hf` (transformers `generate`, here) and `vllm` (sapo/vllm_backend.py,
optional). On CUDA the HF backend generates from a bf16 copy of the policy, refreshed from the trained
weights before each call, with a static KV cache, which transformers compiles (`torch.compile` of
the decode step) on CUDA; prompt widths and batch rows are padded to fixed sizes so the compiled
step sees a few shapes only.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from decentrain.algorithms.sapo import vllm_backend  # noqa: F401 (registers `vllm`; vllm itself is imported when built)
from decentrain.algorithms.sapo.batching import pad_sequences
from decentrain.algorithms.sapo.sampling import (  # noqa: F401 (SamplingConfig and the interface: re-exported)
    GEN_DTYPES,
    GENERATION_BACKENDS,
    GenerationBackend,
    SamplingConfig,
    Scored,
    cut_at_stop,
)

PROMPT_WIDTH_MULTIPLE = 64  # static cache: left-pad prompts to a multiple of this (fewer distinct shapes)


def build_generation_backend(model: Any, tokenizer: Any, cfg: SamplingConfig) -> GenerationBackend:
    return GENERATION_BACKENDS.get(cfg.backend, field="sampling.backend")(model, tokenizer, cfg)


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


def sampled_text_ids(tokenizer: Any, text: str, sampled_ids: list[int]) -> list[int] | None:
    """The ids of `text` in `tokenizer` if they are the first tokens sampled, else None.

    A completion is sent as text (decoded without special tokens, cut at the stop string), so its
    sampled log-probs are usable only where re-tokenising the text gives back the sampled tokens.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if ids == sampled_ids[: len(ids)] else None


def sampling_kwargs(cfg: SamplingConfig, temperature: float, top_p: float, tokenizer: Any) -> dict[str, Any]:
    """`generate`'s sampling arguments, in one place (greedy when temperature is 0)."""
    kwargs: dict[str, Any] = dict(do_sample=True, temperature=temperature, top_p=top_p) if temperature > 0 else {}
    if temperature > 0:  # 0 switches top-k off: transformers would apply its default top_k=50 (TRL's is off)
        kwargs["top_k"] = cfg.top_k or 0
    if cfg.stop:  # lets a batch end early once every row has stopped
        kwargs.update(stop_strings=[cfg.stop], tokenizer=tokenizer)
    return kwargs


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every token id that ends a turn: the generation config's EOS ids and the tokenizer's EOS."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return sorted(set(ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))


def decode_turns(tokenizer: Any, rows: list[list[int]], ends: set[int], end_text: str) -> list[str]:
    """Each row's text up to its first end-of-turn id, followed by `end_text` where there is one."""
    texts = []
    for row in rows:
        cut = next((i for i, t in enumerate(row) if t in ends), None)
        text = tokenizer.decode(row if cut is None else row[:cut], skip_special_tokens=True)
        texts.append(text if cut is None else text + end_text)
    return texts


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
        self.eos_ids = eos_ids(model, tokenizer)
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

    def generate(
        self,
        prompts: list[str],
        num_generations: int,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int = 0,
    ) -> list[list[str]]:
        texts, _ = self._sample(prompts, num_generations, max_new_tokens, temperature, top_p, seed)
        return [texts[i : i + num_generations] for i in range(0, len(texts), num_generations)]

    @torch.no_grad()
    def generate_scored(self, prompts: list[str], num_generations: int, seed: int = 0) -> Scored:
        """`generate` plus each completion's token log-probs under the policy that sampled it.

        They are recomputed by one teacher-forced pass of the generation model over the tokens it
        sampled (log-softmax of logits / temperature, as the trainer computes them), not read from
        `generate(output_scores=True)`: those hold [rows, vocab] per step (GBs for a 150k vocab)
        and are taken after top-k/top-p, which the trainer's log-probs are not.
        """
        texts, sampled = self._sample(prompts, num_generations, None, None, None, seed)
        flat_prompts = [p for p in prompts for _ in range(num_generations)]
        ids = [sampled_text_ids(self.tokenizer, t, s) for t, s in zip(texts, sampled)]
        usable = [i for i, x in enumerate(ids) if x is not None]
        logprobs: list[tuple[float, ...] | None] = [None] * len(texts)
        if usable:
            encode = lambda t: self.tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
            prompt_ids, prompt_mask = pad_sequences([encode(flat_prompts[i]) for i in usable], self.pad_id, left=True)
            completion_ids, completion_mask = pad_sequences([ids[i] for i in usable], self.pad_id, left=False)
            device = next(self.model.parameters()).device
            model = self.rollout_model(device)
            was_training = model.training
            model.eval()
            try:
                logps = completion_logprobs(
                    model,
                    prompt_ids.to(device),
                    prompt_mask.to(device),
                    completion_ids.to(device),
                    completion_mask.to(device),
                    self.cfg.batch_size,
                    self.cfg.temperature or 1.0,
                ).cpu()
            finally:
                model.train(was_training)
            for row, i in enumerate(usable):
                logprobs[i] = tuple(logps[row, : len(ids[i])].tolist())
        g = num_generations
        return (
            [texts[i : i + g] for i in range(0, len(texts), g)],
            [logprobs[i : i + g] for i in range(0, len(texts), g)],
        )

    @torch.no_grad()
    def _sample(
        self,
        prompts: list[str],
        num_generations: int,
        max_new_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        seed: int,
    ) -> tuple[list[str], list[list[int]]]:
        """Flat, prompt-major completion texts (cut at the stop string) and the token ids sampled."""
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
        sampled: list[list[int]] = []
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
                    out_texts, out_ids = self._generate_batch(model, rows, device, max_new_tokens, kwargs, static)
                    texts += out_texts[: len(batch)]
                    sampled += out_ids[: len(batch)]
        finally:
            model.train(was_training)
        return [cut_at_stop(t, cfg.stop) for t in texts], sampled

    def _generate_batch(
        self,
        model: Any,
        prompts: list[str],
        device: torch.device,
        max_new_tokens: int,
        kwargs: dict[str, Any],
        static: bool,
    ) -> tuple[list[str], list[list[int]]]:
        enc = self.tokenizer(
            prompts,
            add_special_tokens=False,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            pad_to_multiple_of=PROMPT_WIDTH_MULTIPLE if static else None,
        ).to(device)
        if self.cfg.end_of_turn is not None:  # chat models: stop on any end-of-turn id, not only the first
            kwargs = {**kwargs, "eos_token_id": self.eos_ids}
        out = model.generate(**enc, max_new_tokens=max_new_tokens, use_cache=True, pad_token_id=self.pad_id, **kwargs)
        new = out[:, enc["input_ids"].size(1) :]
        if self.cfg.end_of_turn is not None:
            return decode_turns(self.tokenizer, new.tolist(), set(self.eos_ids), self.cfg.end_of_turn), new.tolist()
        return self.tokenizer.batch_decode(new, skip_special_tokens=True), new.tolist()


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
        logits = (
            model(
                input_ids=input_ids[sl],
                attention_mask=attention_mask[sl],
                position_ids=position_ids[sl],
                logits_to_keep=c + 1,
                use_cache=False,
            )
            .logits[:, :-1]
            .float()
        )
        if temperature != 1.0:
            logits = logits / temperature
        logps = torch.gather(F.log_softmax(logits, dim=-1), 2, completion_ids[sl, :, None]).squeeze(-1)
        out.append(logps)
    return torch.cat(out, dim=0)
