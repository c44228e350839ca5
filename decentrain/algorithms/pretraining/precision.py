"""Precision and compilation of the inner model: the usual choices, resolved once per run.

Precision:
- `fp32`: fp32 weights, fp32 math.
- `bf16_autocast`: fp32 master weights and AdamW state, matmuls in bf16 under
  `torch.autocast` (the default on CUDA; small late updates do not round away).
- `bf16`: pure bf16 weights and optimizer state, an explicit choice (less memory).
The outer optimizers (algorithms/outer/updates.py) keep fp32 slow weights and momentum
whatever the inner precision is.
"""

from __future__ import annotations

import contextlib
import time
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


def set_tf32(device: torch.device, enabled: bool) -> None:
    """fp32 matmuls and convolutions on TF32 tensor cores (Ampere and later; `train.tf32`).

    TF32 keeps fp32's range with a 10-bit mantissa, at several times the IEEE fp32 rate: the usual
    choice for training (bf16 autocast leaves some matmuls, e.g. under `fp32`, in fp32). Process-wide
    in torch; a no-op off CUDA.
    """
    if device.type != "cuda":
        return
    mode = "tf32" if enabled else "ieee"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9; mixing with the old API is refused
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
    else:
        torch.set_float32_matmul_precision("high" if enabled else "highest")
        torch.backends.cudnn.allow_tf32 = enabled


class DeviceTimer:
    """Seconds of device time between `start()` and `stop()`.

    On CUDA the host only launches kernels and runs ahead of the GPU, so a host clock measures launch
    time; CUDA events on the current stream measure the work itself. `stop()` waits for it (a host
    sync), so use it where the time is needed (adaptive pacing), not on every step.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._start: object = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> float:
        if self._start is None:
            raise RuntimeError("DeviceTimer.stop() before start()")
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return self._start.elapsed_time(end) / 1e3  # ms -> s
        return time.perf_counter() - self._start
