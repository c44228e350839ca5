import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

from decentrain.algorithms.sapo.batching import pad_sequences
from decentrain.algorithms.sapo.generation import (
    GenerationBackend,
    HFGenerationBackend,
    SamplingConfig,
    completion_logprobs,
)

PROMPTS = ["Q: 1 + 2\nA: ", "Q: how many legs?\nA: ", "Q: x\nA: "]


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
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def test_sampling_config_validation():
    for field, bad in [("temperature", -1.0), ("top_p", 0.0), ("batch_size", 0)]:
        with pytest.raises(ValueError, match=field):
            SamplingConfig(**{field: bad})


def test_generate_shapes_seed_and_stop(model, tok):
    backend: GenerationBackend = HFGenerationBackend(model, tok, SamplingConfig(stop="a", batch_size=4))
    rng_before = torch.get_rng_state()
    out = backend.generate(PROMPTS, num_generations=3, max_new_tokens=12, temperature=1.0, top_p=0.95, seed=7)
    assert torch.equal(torch.get_rng_state(), rng_before)  # global RNG untouched
    assert len(out) == 3 and all(len(g) == 3 for g in out)
    assert all(isinstance(c, str) and ("a" not in c[:-1]) for g in out for c in g)  # cut after the stop string
    again = backend.generate(PROMPTS, num_generations=3, max_new_tokens=12, temperature=1.0, top_p=0.95, seed=7)
    assert again == out
    other = backend.generate(PROMPTS, num_generations=3, max_new_tokens=12, temperature=1.0, top_p=0.95, seed=8)
    assert other != out


def test_greedy_is_independent_of_batching_and_padding(model, tok):
    one = HFGenerationBackend(model, tok, SamplingConfig(stop=None, batch_size=1, max_new_tokens=8, temperature=0.0))
    many = HFGenerationBackend(model, tok, SamplingConfig(stop=None, batch_size=64, max_new_tokens=8, temperature=0.0))
    a, b = one.generate(PROMPTS, 2), many.generate(PROMPTS, 2)
    assert a == b and all(g[0] == g[1] for g in a)  # greedy: the G copies agree


def test_completion_logprobs_match_unpadded_forward(model, tok):
    def enc(s):
        return tok(s, add_special_tokens=False)["input_ids"]

    prompts = [enc(p) for p in PROMPTS]
    completions = [enc("12\n"), enc("7"), enc("abcd")]
    prompt_ids, prompt_mask = pad_sequences(prompts, 0, left=True)
    completion_ids, completion_mask = pad_sequences(completions, 0, left=False)
    with torch.no_grad():
        got = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, micro_batch_size=2)
        assert got.shape == completion_ids.shape
        for i, (p, c) in enumerate(zip(prompts, completions)):
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
            ref = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(c)[:, None]).squeeze(1)
            torch.testing.assert_close(got[i, : len(c)], ref, atol=1e-5, rtol=1e-5)
        one = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, micro_batch_size=1)
        torch.testing.assert_close(got * completion_mask, one * completion_mask, atol=1e-5, rtol=1e-5)
        hot = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 3, temperature=2.0)
        assert not torch.allclose(hot, got)


def test_completion_logprobs_carry_gradients(model, tok):
    ids, mask = pad_sequences([tok("Q: 1\nA: ", add_special_tokens=False)["input_ids"]], 0, left=True)
    cids, cmask = pad_sequences([tok("3\n", add_special_tokens=False)["input_ids"]], 0, left=False)
    logps = completion_logprobs(model, ids, mask, cids, cmask, micro_batch_size=1)
    (logps * cmask).sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad()


def test_top_k_is_off_unless_set(model, tok, monkeypatch):
    # transformers applies its generation default top_k=50 unless top_k=0 is passed; TRL's default is off.
    seen = []
    real = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: seen.append(kw.get("top_k")) or real(**kw))
    HFGenerationBackend(model, tok, SamplingConfig(max_new_tokens=2)).generate(PROMPTS[:1], 2, seed=0)
    HFGenerationBackend(model, tok, SamplingConfig(max_new_tokens=2, top_k=5)).generate(PROMPTS[:1], 2, seed=0)
    assert seen == [0, 5]
    with pytest.raises(ValueError, match="top_k=-1"):
        SamplingConfig(top_k=-1)
