"""Models and tokenizers from `transformers`: tiny ones built from config, or loaded by path / hub id."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import sys
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
    close = difflib.get_close_matches(path.relative_to(parent).parts[0] if path.is_relative_to(parent) else path.name, names, n=3)
    hint = f"; did you mean {', '.join(str(parent / c) for c in close)}?" if close else f" ({parent} exists)"
    return ValueError(f"{field}={value}: no such directory{hint}")


def check_model_source(value: str | None, field: str, hub_problem=_hub_problem, cache_file: str = "config.json") -> None:
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
        raise ValueError(f"{field}={value}: no such local directory, and hub id {value!r} is not in the local Hugging Face "
                         "cache (HF_HUB_OFFLINE=1): download it where the hub is reachable, or pass a local directory")
    problem = hub_problem(value)
    if problem is not None:
        raise ValueError(f"{field}={value}: no such local directory, {problem}")


def check_model_paths(cfg: ModelConfig, where: str = "model", hub_problem=_hub_problem) -> None:
    """`model.pretrained` and `model.tokenizer` name something loadable (see check_model_source)."""
    check_model_source(cfg.pretrained, f"{where}.pretrained", hub_problem)
    check_model_source(cfg.tokenizer, f"{where}.tokenizer", hub_problem, cache_file="tokenizer_config.json")


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


@contextlib.contextmanager
def _no_deepspeed_probe():
    """save_pretrained unwraps the model through accelerate, which imports DeepSpeed when it is installed
    (seconds, and its "Setting accelerator to CPU" warning on every run) only to test isinstance against
    DeepSpeedEngine. The model handed here is a plain transformers module: unless DeepSpeed is already in
    use (its engine imported it), tell accelerate it is absent for this call."""
    other = sys.modules.get("accelerate.utils.other")
    if other is None:
        try:
            import accelerate.utils.other as other
        except ImportError:  # no accelerate: transformers unwraps by itself, without DeepSpeed
            other = None
    if other is None or "deepspeed" in sys.modules or not hasattr(other, "is_deepspeed_available"):
        yield
        return
    probe = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = probe


def save_model(model: PreTrainedModel, tokenizer, out_dir: str | Path) -> Path:
    """`save_pretrained` (safetensors) of the model and its tokenizer, loadable with `pretrained=`."""
    out = Path(out_dir)
    save_weights(model, out)
    tokenizer.save_pretrained(out)
    return out


def save_weights(model: PreTrainedModel, out_dir: str | Path) -> None:
    """`model.save_pretrained(out_dir)` (safetensors, config) on whichever rank calls it.

    transformers 5 writes the files only on torch.distributed's rank 0, whatever `is_main_process`
    says (`should_save_on_this_rank`). Here each caller saves a model of its own (a DEI node's
    operator, an HDEE expert, a SAPO node's weights for vLLM): on every other rank the directory
    got the tokenizer alone, and loading it failed ("Unrecognized model ... model_type")."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process  # the caller decides who saves
    try:
        with _no_deepspeed_probe():
            model.save_pretrained(out_dir, safe_serialization=True)
    finally:
        del model.should_save_on_this_rank


def num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
