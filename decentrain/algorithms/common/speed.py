"""Precision and compilation of the inner model: the usual choices, resolved once per run.

Precision:
- `fp32`: fp32 weights, fp32 math.
- `bf16_autocast`: fp32 master weights and AdamW state, matmuls in bf16 under
  `torch.autocast` (the default on CUDA; small late updates do not round away).
- `bf16`: pure bf16 weights and optimizer state, an explicit choice (less memory).
The outer optimizers (algorithms/common/outer.py) keep fp32 slow weights and momentum
whatever the inner precision is.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

PRECISIONS = ("auto", "fp32", "bf16_autocast", "bf16")
COMPILE_SCOPES = ("none", "model", "blocks")


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` is bf16 autocast on CUDA and fp32 elsewhere (CPU bf16 is slow on most CPUs)."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision={precision!r} is unknown; allowed: {list(PRECISIONS)}")
    if precision == "auto":
        return "bf16_autocast" if device.type == "cuda" else "fp32"
    return precision


def weight_dtype(precision: str) -> torch.dtype:
    """The dtype parameters are stored (and AdamW state kept) in, for a resolved precision."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


def autocast(precision: str, device: torch.device) -> ContextManager:
    """The forward's context: bf16 autocast for `bf16_autocast`, nothing otherwise."""
    if precision == "bf16_autocast":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The repeated layers of a transformers causal LM (`model.model.layers`), or the longest ModuleList."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ValueError("train.compile=blocks: the model has no ModuleList of layers; use train.compile=model")
    return max(lists, key=len)


def apply_compile(model: torch.nn.Module, scope: str) -> torch.nn.Module:
    """torch.compile in place (`Module.compile`), so state_dict keys and the module object stay.

    `blocks` compiles each layer (as torchtitan does): one graph reused by every layer,
    short compile times, and it composes with FSDP2 and DDP wrapping afterwards.
    """
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"train.compile={scope!r} is unknown; allowed: {list(COMPILE_SCOPES)}")
    if scope == "model":
        model.compile()
    elif scope == "blocks":
        for block in transformer_blocks(model):
            block.compile()
    return model
