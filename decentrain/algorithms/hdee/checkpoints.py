"""The models HDEE merges and loads: whole, finite, compatible, and of a size that fits, or refused in one line.

A save_pretrained directory is data, written by another job or another party. transformers fills a
tensor the file lacks with a fresh initialisation and drops one the model lacks (its load report
goes to the console, nothing more), loads NaN like any other number, and allocates whatever sizes
config.json names. A merge built on such a model routes, saves and scores without complaint: NaN
features send every token to expert 0, and another vocabulary fails only at scoring. So, before any
weights are read: the directory exists (`check_model_source`), its config is a causal LM whose size
fits this machine (measured on the meta device, after a cap on its layer count), and its vocabulary
and tokenizer are the backbone's; once read: no tensor missing, unexpected or of another shape, and
none non-finite. Every refusal is a `CheckpointError`: one line naming the model and what is wrong.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel

from decentrain.models.factory import check_model_source

ROUTED_MODEL_TYPE = "decentrain_routed_experts"  # a routed model is never a routed model's part
MAX_LAYERS = 1024  # measuring builds every layer on the meta device: a config naming 10**9 layers is refused first
SHOWN = 4  # tensor names a message lists


class CheckpointError(ValueError):
    """A model, or its config, that HDEE refuses to load or merge (one line naming it and why)."""


def memory_bytes() -> int:
    """This machine's physical memory: the most any model read here may take."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _names(keys: Sequence[str]) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:SHOWN]) + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")


def config_from_dict(d: Any, where: str) -> PretrainedConfig:
    """A part's transformers config from a routed config's dict (`model_type` and its fields)."""
    if not isinstance(d, Mapping) or not isinstance(d.get("model_type"), str):
        raise CheckpointError(f"{where}: not a model config (a dict with a model_type)")
    fields = dict(d)
    try:
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    except Exception as e:  # noqa: BLE001 -- whatever the file says, one line
        raise CheckpointError(f"{where}: not a config transformers can build ({_line(e)})") from None


def model_bytes(config: PretrainedConfig, where: str) -> int:
    """Bytes of the causal LM `config` describes (parameters and buffers), measured without allocating."""
    if config.model_type == ROUTED_MODEL_TYPE:
        raise CheckpointError(f"{where}: a routed model cannot be a part of another")
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= MAX_LAYERS:
        raise CheckpointError(f"{where}: num_hidden_layers={layers!r} must be an integer in [1, {MAX_LAYERS}]")
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 -- a bad size or an unknown architecture: one line
        raise CheckpointError(f"{where}: not a causal LM transformers can build ({_line(e)})") from None
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def check_fits(total: int, where: str, limit: int | None = None) -> None:
    limit = memory_bytes() if limit is None else limit
    if total > limit:
        raise CheckpointError(
            f"{where}: its config names {total / 2**30:.1f} GiB of tensors, more than the "
            f"{limit / 2**30:.1f} GiB of memory here"
        )


def read_config(path: str, where: str) -> PretrainedConfig:
    """`path`'s config.json, after `check_model_source` (a missing directory is one line, not a traceback)."""
    try:
        check_model_source(path, where)
        return AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 -- a missing or unreadable config: one line
        raise CheckpointError(
            e
            if isinstance(e, ValueError) and "\n" not in str(e)
            else f"{where}={path}: no readable model config ({_line(e)})"
        ) from None


def read_tokenizer(path: str, where: str):
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 -- no tokenizer files, or unreadable ones
        raise CheckpointError(
            f"{where}={path}: no tokenizer saved beside the model ({_line(e)}); a merged model "
            "needs every expert's tokenizer to check it is the backbone's"
        ) from None


def check_tokenizer(tokenizer, reference, where: str) -> None:
    """The same token ids for the same text: one class, one vocabulary, the same special tokens."""
    same = (
        type(tokenizer) is type(reference)
        and tokenizer.get_vocab() == reference.get_vocab()
        and tokenizer.all_special_tokens == reference.all_special_tokens
    )
    if not same:
        raise CheckpointError(
            f"{where}: its tokenizer ({type(tokenizer).__name__}, {len(tokenizer)} tokens) is not the "
            f"backbone's ({type(reference).__name__}, {len(reference)} tokens)"
        )


def check_vocab(config: PretrainedConfig, vocab_size: int, where: str) -> None:
    if getattr(config, "vocab_size", None) != vocab_size:
        raise CheckpointError(
            f"{where}: vocab_size={getattr(config, 'vocab_size', None)}, the backbone's is {vocab_size}"
        )


def check_keys(info: Mapping[str, Any], where: str) -> None:
    """transformers' loading info: a tensor missing (freshly initialised), unexpected (dropped) or of another shape."""
    for key, what in (
        ("missing_keys", "missing"),
        ("unexpected_keys", "unexpected"),
        ("mismatched_keys", "of another shape"),
    ):
        keys = [k[0] if isinstance(k, tuple) else k for k in info.get(key) or ()]
        if keys:
            raise CheckpointError(f"{where}: {len(keys)} tensor(s) {what}: {_names(keys)}")
    if info.get("error_msgs"):
        raise CheckpointError(f"{where}: {_line(ValueError(info['error_msgs'][0]))}")


def check_finite(model: torch.nn.Module, where: str) -> None:
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise CheckpointError(f"{where}: {len(bad)} tensor(s) hold NaN or inf: {_names(bad)}")


def load_model(path: str, where: str) -> PreTrainedModel:
    """A whole model from `path` in float32: every tensor its config names, and no other.

    Finiteness is `check_finite`'s."""
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True
        )  # reported, then refused
    except Exception as e:  # noqa: BLE001 -- an unreadable weights file: one line
        raise CheckpointError(f"{where}={path}: weights not loadable ({_line(e)})") from None
    check_keys(info, where)
    return model.eval()
