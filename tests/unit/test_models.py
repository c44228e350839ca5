import pytest
import torch

from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, num_params, save_model

TINY = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.mark.parametrize("family,cls", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_tiny_models_build_from_config(family, cls):
    cfg = ModelConfig(family=family, num_kv_heads=1, **TINY)
    tok = build_tokenizer(cfg)
    model = build_model(cfg, tok)
    assert type(model).__name__ == cls and model.config.vocab_size == len(tok) == 384
    ids = torch.tensor([tok("hello")["input_ids"]])
    assert model(input_ids=ids, labels=ids).loss.isfinite()


def test_save_pretrained_roundtrip_through_the_path_loader(tmp_path):
    cfg = ModelConfig(**TINY)
    tok = build_tokenizer(cfg)
    model = build_model(cfg, tok)
    save_model(model, tok, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists()
    loaded_cfg = ModelConfig(pretrained=str(tmp_path / "m"), tokenizer=str(tmp_path / "m"))
    loaded = build_model(loaded_cfg)
    assert num_params(loaded) == num_params(model)
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    assert build_tokenizer(loaded_cfg)("ab")["input_ids"] == tok("ab")["input_ids"]


def test_a_hub_id_fails_fast_offline():
    # the hub path is real code; with HF_HUB_OFFLINE=1 (set in conftest) it fails at once
    with pytest.raises(OSError):
        build_model(ModelConfig(pretrained="Qwen/Qwen2.5-0.5B-Instruct"))


def test_bad_model_config_names_the_field():
    with pytest.raises(ValueError, match="model.hidden_size=30 must be divisible by model.num_heads=4"):
        ModelConfig(hidden_size=30, num_heads=4)
