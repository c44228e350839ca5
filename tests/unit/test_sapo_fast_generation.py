"""SAPO generation on the fast path: bf16 copy, static KV cache, fixed shapes, one host read per train step,
and the optional vLLM backend (skipped without vllm)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

from decentrain.algorithms.sapo.generation import (
    HFGenerationBackend,
    SamplingConfig,
    generation_dtype,
)

PROMPTS = ["Q: 1 + 2\nA: ", "Q: how many legs?\nA: ", "Q: x\nA: "]
CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def tok():
    return ByT5Tokenizer()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=384,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def test_cuda_defaults_are_bf16_and_a_static_cache_cpu_keeps_the_model_dtype(model, tok):
    backend = HFGenerationBackend(model, tok, SamplingConfig())
    assert generation_dtype(backend.cfg, model, CUDA) == torch.bfloat16 and backend.static_cache(CUDA)
    assert generation_dtype(backend.cfg, model, torch.device("cpu")) == torch.float32
    assert not backend.static_cache(torch.device("cpu"))
    assert backend.rollout_model(torch.device("cpu")) is model  # no copy when the dtype matches
    for field, bad in [("dtype", "int8"), ("cache", "paged"), ("backend", "tgi")]:
        with pytest.raises(ValueError, match=f"sampling.{field}"):
            SamplingConfig(**{field: bad})


def test_static_cache_with_padded_shapes_gives_the_dynamic_cache_greedy_text(model, tok):
    common = dict(stop=None, max_new_tokens=6, temperature=0.0, batch_size=4)  # 6 rows: a short last batch
    dynamic = HFGenerationBackend(model, tok, SamplingConfig(cache="dynamic", **common)).generate(PROMPTS, 2)
    static = HFGenerationBackend(model, tok, SamplingConfig(cache="static", **common)).generate(PROMPTS, 2)
    assert static == dynamic and len(static) == 3 and all(len(g) == 2 for g in static)


def test_bf16_generation_copy_follows_the_trained_weights(model, tok):
    backend = HFGenerationBackend(
        model, tok, SamplingConfig(dtype="bfloat16", stop=None, max_new_tokens=4, temperature=0.0)
    )
    backend.generate(PROMPTS[:1], 2)
    rollout = backend._copy
    assert rollout is not None and next(rollout.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the policy trains in its own dtype
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # "an optimizer step"
    try:
        backend.generate(PROMPTS[:1], 2)
        assert backend._copy is rollout  # refreshed in place, not rebuilt
        torch.testing.assert_close(rollout.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))
    finally:
        with torch.no_grad():
            model.lm_head.weight.mul_(0.5)


def test_sapo_train_step_reads_the_host_once(monkeypatch):
    from decentrain.algorithms.sapo.batching import ScoredGroup
    from decentrain.algorithms.sapo.grpo import SAPOLossConfig
    from decentrain.algorithms.sapo.node import SAPONode
    from decentrain.algorithms.sapo.payload import RolloutGroup
    from decentrain.testing import tiny_sapo_config

    class NoExchange:
        def exchange(self, round_, payload):
            return []

        def close(self):
            pass

    cfg = tiny_sapo_config(exchange="collective", num_local=0, num_external=1)
    cfg.loss = SAPOLossConfig(num_generations=4)
    cfg.train.micro_batch_size = 1  # 4 micro-batches
    node = SAPONode(cfg, 0, "node0", NoExchange())
    group = RolloutGroup("chain_sum", "0" * 16, 0, 10, 0, "q 3 + 4 =", ("7\n", "2\n", "7\n", "1\n"))

    items = []
    real_item = torch.Tensor.item

    def item(t):  # recorded when SAPO's own code calls it (torch's CPU AdamW reads its step counter too)
        caller = sys._getframe(1).f_code.co_filename
        if "decentrain" in caller:
            items.append(caller)
        return real_item(t)

    monkeypatch.setattr(torch.Tensor, "item", item)
    out = node.train_step([ScoredGroup(group, [1.0, 0.0, 1.0, 0.0], True)])
    monkeypatch.undo()
    assert len(items) <= 1, f"{len(items)} .item() for 4 micro-batches"  # LossNorm's token count, on the host mask
    assert out["trained_completions"] == 4 and out["loss"] == out["loss"] and out["grad_norm"] > 0


def test_vllm_backend_without_vllm_fails_at_config_time():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed")
    with pytest.raises(ValueError, match="sampling.backend='vllm' needs the vllm package"):
        SamplingConfig(backend="vllm")


def test_vllm_sampling_params_carry_the_hf_meaning():
    from decentrain.algorithms.sapo.vllm_backend import vllm_sampling_params

    params = vllm_sampling_params(SamplingConfig(stop="\n"), n=8, max_new_tokens=32, temperature=0.7, top_p=0.9, seed=3)
    assert params == dict(
        n=8, max_tokens=32, temperature=0.7, top_p=0.9, seed=3, stop=["\n"], include_stop_str_in_output=True
    )
