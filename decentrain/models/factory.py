"""Models and tokenizers from `transformers`: tiny ones built from config, or loaded by path / hub id."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, ByT5Tokenizer, LlamaConfig, PreTrainedModel, Qwen2Config

from decentrain.core.registry import Registry

BYTE_TOKENIZER = "byt5"  # transformers.ByT5Tokenizer(): byte-level, needs no download
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

FAMILIES: Registry[type] = Registry("model.family")
FAMILIES.register("llama")(LlamaConfig)
FAMILIES.register("qwen2")(Qwen2Config)


@dataclass
class ModelConfig:
    name: str = "llama_tiny"  # label of the conf/model entry
    family: str = "llama"
    pretrained: str | None = None  # local dir or hub id; None builds from the fields below
    tokenizer: str = BYTE_TOKENIZER  # "byt5" or a local dir / hub id
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    intermediate_size: int = 352
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        FAMILIES.get(self.family, field="model.family")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is unknown; allowed: {list(DTYPES)}")
        for f in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_seq_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"model.{f}={getattr(self, f)} must be >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.hidden_size={self.hidden_size} must be divisible by model.num_heads={self.num_heads}")


def build_tokenizer(cfg: ModelConfig):
    if cfg.tokenizer == BYTE_TOKENIZER:
        return ByT5Tokenizer()
    return AutoTokenizer.from_pretrained(cfg.tokenizer)


def hf_config(cfg: ModelConfig, vocab_size: int, **overrides):
    """The transformers config of a from-scratch model (`overrides` e.g. a per-expert width)."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads or cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_seq_len,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_embeddings,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=1,
    )
    fields.update(overrides)
    return FAMILIES.get(cfg.family)(**fields)


def build_model(cfg: ModelConfig, tokenizer=None, **overrides) -> PreTrainedModel:
    """Load `cfg.pretrained` if set, else build from config with random init (seed first)."""
    dtype = DTYPES[cfg.dtype]
    if cfg.pretrained:
        return AutoModelForCausalLM.from_pretrained(cfg.pretrained, dtype=dtype)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(cfg)
    model = AutoModelForCausalLM.from_config(hf_config(cfg, len(tokenizer), **overrides), dtype=dtype)
    return model


def save_model(model: PreTrainedModel, tokenizer, out_dir: str | Path) -> Path:
    """`save_pretrained` (safetensors) of the model and its tokenizer, loadable with `pretrained=`."""
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
