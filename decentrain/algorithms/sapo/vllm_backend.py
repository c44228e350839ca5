"""Optional vLLM generation backend (`sampling.backend=vllm`), for users who install vllm.

vLLM runs in this process beside the trained model (TRL's "colocate" mode): at start-up the policy
is written once with `save_pretrained` to a scratch directory that vLLM loads; before each
`generate` the current trained weights are pushed into vLLM's model with its `load_weights`
(names are the transformers ones, which vLLM's model classes map). Written against vLLM's documented
offline API (`LLM`, `SamplingParams`, `RequestOutput.outputs[i].text`); it needs one GPU and a model
vLLM supports (e.g. a pretrained Qwen2/Llama with its tokenizer; not the byte-level tiny models).
No test here runs it: CI has neither vllm nor a GPU (tests/unit/test_sapo_fast_generation.py checks
that choosing it without vllm fails at config time).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

from decentrain.algorithms.sapo.sampling import GENERATION_BACKENDS, SamplingConfig, cut_at_stop
from decentrain.models.factory import save_model


def vllm_sampling_params(
    cfg: SamplingConfig, n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int
) -> dict[str, Any]:
    """`vllm.SamplingParams` fields for one prompt's G samples (kept beside the HF kwargs' meaning)."""
    params: dict[str, Any] = dict(n=n, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    top_k = getattr(cfg, "top_k", None)
    if top_k is not None:
        params["top_k"] = top_k
    if cfg.stop:
        params.update(stop=[cfg.stop], include_stop_str_in_output=True)  # HF's backend keeps it too
    return params


@GENERATION_BACKENDS.register("vllm")
class VLLMGenerationBackend:
    """`GenerationBackend` on a colocated `vllm.LLM`."""

    def __init__(
        self, model: Any, tokenizer: Any, cfg: SamplingConfig | None = None, gpu_memory_utilization: float = 0.3
    ):
        import vllm  # raises ImportError with the package's own message when missing

        self.vllm, self.model, self.tokenizer = vllm, model, tokenizer
        self.cfg = cfg or SamplingConfig()
        # one process owns the engine, so its model object is reachable for weight updates
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._dir = tempfile.TemporaryDirectory(prefix="decentrain_vllm_")
        save_model(model, tokenizer, self._dir.name)  # on this node's rank, whichever it is
        dtype = "bfloat16" if self.cfg.dtype in ("auto", "bfloat16") else self.cfg.dtype
        self.llm = vllm.LLM(
            model=self._dir.name, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True
        )  # the G copies of a prompt share its prefill

    def _push_weights(self) -> None:
        # the documented colocate path (as TRL's): vLLM's own model object loads (name, tensor) pairs
        runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        with torch.no_grad():
            runner.model.load_weights((name, p.detach()) for name, p in self.model.named_parameters())

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
        self._push_weights()
        params = self.vllm.SamplingParams(
            **vllm_sampling_params(
                cfg,
                num_generations,
                cfg.max_new_tokens if max_new_tokens is None else max_new_tokens,
                cfg.temperature if temperature is None else temperature,
                cfg.top_p if top_p is None else top_p,
                seed,
            )
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[cut_at_stop(c.text, cfg.stop) for c in out.outputs] for out in outputs]

    def generate_scored(self, prompts: list[str], num_generations: int, seed: int = 0):
        """Completions without log-probs: vLLM's per-token logprobs are, by default, of the raw
        logits before temperature, not what the trainer computes, so none are sent (peers train
        these groups uncorrected) rather than numbers that mean something else."""
        texts = self.generate(prompts, num_generations, seed=seed)
        return texts, [[None] * len(t) for t in texts]
