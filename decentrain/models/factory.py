"""Models and tokenizers from `transformers`: tiny ones built from config, or loaded by path / hub id,
or from a GGUF file dequantized once into a local safetensors cache (models/gguf.py), optionally
with LoRA adapters (models/lora.py)."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    ByT5Tokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

from decentrain.core.registry import Registry
from decentrain.models import gguf as gguf_cache
from decentrain.models.lora import DEFAULT_TARGETS, apply_lora, merged_copy
from decentrain.models.saving import save_weights

BYTE_TOKENIZER = "byt5"  # transformers.ByT5Tokenizer(): byte-level, needs no download
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# model.family -> the transformers config of a from-scratch model of that architecture, from its fields
FAMILIES: Registry[Callable[..., PretrainedConfig]] = Registry("model.family")


@FAMILIES.register("llama")
def llama_config(**fields) -> PretrainedConfig:
    return LlamaConfig(**fields)


@FAMILIES.register("qwen2")
def qwen2_config(**fields) -> PretrainedConfig:
    return Qwen2Config(**fields)


@dataclass
class ModelConfig:
    name: str = "llama_tiny"  # label of the conf/model entry
    family: str = "llama"
    pretrained: str | None = None  # local dir or hub id; None builds from the fields below (or gguf_file)
    # "byt5", a local dir / hub id, or None: the tokenizer saved with the weights (pretrained or gguf_file)
    tokenizer: str | None = BYTE_TOKENIZER
    # A GGUF file (a path, or "<package>:<file>" inside an installed package) to dequantize once into
    # gguf_cache (None: $DECENTRAIN_CACHE or ~/.cache/decentrain, under gguf/); `pretrained` wins when set.
    gguf_file: str | None = None
    gguf_cache: str | None = None
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    intermediate_size: int = 352
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    dtype: str = "float32"
    # LoRA through peft (models/lora.py): rank 0 trains every weight
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))

    def __post_init__(self) -> None:
        FAMILIES.get(self.family, field="model.family")
        if self.tokenizer is None and not (self.pretrained or self.gguf_file):
            raise ValueError(
                "model.tokenizer=null (the weights' own tokenizer) needs model.pretrained or model.gguf_file"
            )
        if self.lora_rank < 0 or self.lora_alpha <= 0 or not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(
                f"model.lora_rank={self.lora_rank} must be >= 0, model.lora_alpha={self.lora_alpha} > 0 "
                f"and model.lora_dropout={self.lora_dropout} in [0, 1)"
            )
        if self.lora_rank and not self.lora_targets:
            raise ValueError("model.lora_targets must name at least one module when model.lora_rank > 0")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is unknown; allowed: {list(DTYPES)}")
        for f in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_seq_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"model.{f}={getattr(self, f)} must be >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} must be divisible by model.num_heads={self.num_heads}"
            )


# what a hub id looks like: "name" or "org/name" (letters, digits, . _ -); anything else is a path
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_problem(repo_id: str) -> str | None:
    """None if the hub knows `repo_id`, else why not: one request with a short timeout (transformers'
    own loading retries for ~50 s when the hub is unreachable)."""
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        model_info(repo_id, timeout=10)
    except GatedRepoError:
        return None  # it exists; loading will ask for the token
    except RepositoryNotFoundError:
        return "no such model on the hub either"
    except Exception as e:  # noqa: BLE001 -- offline, DNS, proxy: every way of not reaching the hub
        return f"and the hub cannot be reached ({type(e).__name__}); set HF_HUB_OFFLINE=1 and pass a local directory"
    return None


def _missing_path(value: str, field: str) -> ValueError:
    """`field=value` names no directory: say the deepest part that exists and the closest names there."""
    path = Path(value).expanduser()
    parent = next((p for p in path.parents if p.exists()), Path("."))
    names = sorted(c.name for c in parent.iterdir()) if parent.is_dir() else []
    close = difflib.get_close_matches(
        path.relative_to(parent).parts[0] if path.is_relative_to(parent) else path.name, names, n=3
    )
    hint = f"; did you mean {', '.join(str(parent / c) for c in close)}?" if close else f" ({parent} exists)"
    return ValueError(f"{field}={value}: no such directory{hint}")


def check_model_source(
    value: str | None, field: str, hub_problem=_hub_problem, cache_file: str = "config.json"
) -> None:
    """Before anything starts: a local path (`save_pretrained` dir) exists, and a hub id is tried only
    when it looks like one ("org/name" whose first part is not a local folder); one-line ValueError."""
    if not value or value == BYTE_TOKENIZER:
        return
    path = Path(value).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise ValueError(f"{field}={value}: is a file; expected a save_pretrained directory or a hub id (org/name)")
    first = Path(value).parts[0] if Path(value).parts else value
    if not HUB_ID.fullmatch(value) or (len(Path(value).parts) > 1 and Path(first).expanduser().exists()):
        raise _missing_path(value, field)
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(value, cache_file), str):
        return  # in the local Hugging Face cache
    if _offline():
        raise ValueError(
            f"{field}={value}: no such local directory, and hub id {value!r} is not in the local Hugging Face "
            "cache (HF_HUB_OFFLINE=1): download it where the hub is reachable, or pass a local directory"
        )
    problem = hub_problem(value)
    if problem is not None:
        raise ValueError(f"{field}={value}: no such local directory, {problem}")


def check_model_paths(cfg: ModelConfig, where: str = "model", hub_problem=_hub_problem) -> None:
    """`model.pretrained`, `model.tokenizer` and `model.gguf_file` name something loadable (see check_model_source)."""
    check_model_source(cfg.pretrained, f"{where}.pretrained", hub_problem)
    check_model_source(cfg.tokenizer, f"{where}.tokenizer", hub_problem, cache_file="tokenizer_config.json")
    if cfg.gguf_file and not cfg.pretrained:
        gguf_cache.resolve_gguf(cfg.gguf_file, f"{where}.gguf_file")


def weights_source(cfg: ModelConfig) -> str | None:
    """Where the pretrained weights load from: `pretrained`, else the GGUF's cache entry (converted
    on first use), else None (built from config)."""
    if cfg.pretrained:
        return cfg.pretrained
    if cfg.gguf_file:
        return str(gguf_cache.ensure_cached(cfg.gguf_file, cfg.gguf_cache))
    return None


def build_tokenizer(cfg: ModelConfig):
    if cfg.tokenizer == BYTE_TOKENIZER:
        return ByT5Tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or weights_source(cfg))
    if tokenizer.pad_token is None:  # batched generation pads; the end-of-text token is never trained as padding
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


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
    """Load `cfg.pretrained` (or the GGUF's cache) if set, else build from config with random init
    (seed first); with `lora_rank > 0`, wrapped in peft LoRA adapters (only they train)."""
    dtype = DTYPES[cfg.dtype]
    source = weights_source(cfg)
    if source:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    else:
        tokenizer = tokenizer if tokenizer is not None else build_tokenizer(cfg)
        model = AutoModelForCausalLM.from_config(hf_config(cfg, len(tokenizer), **overrides), dtype=dtype)
    if cfg.lora_rank:
        model = apply_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets)
    return model


def save_model(model: PreTrainedModel, tokenizer, out_dir: str | Path) -> Path:
    """`save_pretrained` (safetensors) of the model and its tokenizer, loadable with `pretrained=`
    (a LoRA model is saved with its adapters merged: a plain model, no peft needed to load it)."""
    out = Path(out_dir)
    save_weights(merged_copy(model), out)
    tokenizer.save_pretrained(out)
    return out


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
