"""Outer-update math shared by DiLoCo, Streaming DiLoCo and NoLoCo.

Everything here is a small function on lists of tensors (one entry per model
parameter), so the algorithms only decide *when* to call it and *what* to
exchange. No communication happens in this module.

Notation (see ../shared/DESIGN.md): θ = fast/local weights trained by the inner
optimizer, φ or θ_prev = slow/global weights kept by the outer optimizer,
Δ = φ − θ the pseudo-gradient (points "downhill" like a gradient).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from decentrain.algorithms.outer.optimizers import OUTER_OPTIMIZERS, OuterOptimizerConfig

Tensors = Sequence[Tensor]
QuantKind = Literal["none", "fp16", "int4"]

# --------------------------------------------------------------------------- DiLoCo


@torch.no_grad()
def pseudo_gradient(prev: Tensors, local: Tensors) -> list[Tensor]:
    """Δ = θ_prev − θ_local in fp32. The caller averages it across replicas."""
    return [p.float() - q.float() for p, q in zip(prev, local, strict=True)]


class OuterOptimizer:
    """The slow weights φ and the outer optimizer that moves them (`algorithm.outer_optimizer`).

    Like torchft's DiLoCo, the outer step is a plain torch optimizer: the averaged
    pseudo-gradient is written into `.grad` of the slow copy and the optimizer does
    the rest, so its semantics are exactly PyTorch's (default: Nesterov SGD,
        b ← μ·b + Δ̄ ;  θ ← θ − η·(Δ̄ + μ·b) ).
    Slow weights live in fp32 whatever the model dtype. Streaming DiLoCo keeps
    one per fragment, built from that fragment's parameters; NoLoCo one per replica.
    """

    def __init__(self, params: Tensors, cfg: OuterOptimizerConfig | None = None):
        self.cfg = OuterOptimizerConfig.convert(cfg or OuterOptimizerConfig())  # the rule's own config class
        self.slow = [p.detach().clone().float() for p in params]
        self.opt = OUTER_OPTIMIZERS.get(self.cfg.name).build(self.slow, self.cfg)

    def pseudo_gradient(self, local: Tensors) -> list[Tensor]:
        return pseudo_gradient(self.slow, local)

    @torch.no_grad()
    def step(self, avg_delta: Tensors) -> None:
        """One outer step on the averaged pseudo-gradient Δ̄ (already averaged)."""
        for s, d in zip(self.slow, avg_delta, strict=True):
            s.grad = d.to(device=s.device, dtype=s.dtype)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def copy_to(self, params: Tensors) -> None:
        """Reset the local weights to the new slow weights (start of the next round)."""
        for p, s in zip(params, self.slow, strict=True):
            p.copy_(s)

    def state_dict(self) -> dict[str, Any]:
        # Deep copy: SGD's state_dict shares its momentum buffers with the live optimizer.
        return {
            "name": self.cfg.name,
            "slow": [s.clone() for s in self.slow],
            "opt": copy.deepcopy(self.opt.state_dict()),
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name", self.cfg.name) != self.cfg.name:  # another rule's state would load silently
            raise ValueError(
                f"algorithm.outer_optimizer.name={self.cfg.name!r} differs from the checkpoint's "
                f"{state['name']!r}; resume with the same outer optimizer or start a fresh run_dir"
            )
        if len(state["slow"]) != len(self.slow):
            raise ValueError(f"outer state has {len(state['slow'])} tensors, model has {len(self.slow)}")
        for s, saved in zip(self.slow, state["slow"]):
            if s.shape != saved.shape:
                raise ValueError(f"outer state shape {tuple(saved.shape)} != model shape {tuple(s.shape)}")
            s.copy_(saved)
        self.opt.load_state_dict(state["opt"])


# --------------------------------------------------------------------------- Streaming DiLoCo


def strided_fragments(num_layers: int, num_fragments: int) -> list[list[int]]:
    """Fragment f holds layers f, f+P, f+2P, … (the paper's strided pattern).

    Strided rather than contiguous so every fragment spans the whole depth. The
    layer counts differ by at most one; payloads are not equal once the embeddings
    and head join two of the fragments (see `fragment_param_names`).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers} must be >= 1")
    if not 1 <= num_fragments <= num_layers:
        raise ValueError(f"num_fragments={num_fragments} must be in [1, num_layers={num_layers}]")
    return [list(range(f, num_layers, num_fragments)) for f in range(num_fragments)]


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_FIRST = re.compile(r"(?:^|\.)embed_tokens\.")  # input embeddings
_LAST = re.compile(r"(?:^|\.)(?:norm|lm_head)\.")  # final norm and output head


def fragment_param_names(names: Iterable[str], num_layers: int, num_fragments: int) -> list[list[str]]:
    """Split HF Llama/Qwen2 parameter names into strided fragments.

    `*.layers.{i}.*` goes with layer i. The embeddings go with the fragment of
    layer 0 (fragment 0) and the final norm / lm_head with the fragment of the
    last layer ((num_layers-1) % num_fragments): they sit next to those layers
    in the graph, and unless the two fragments coincide, the two big vocab
    matrices of an untied model land in different payloads.
    Tied heads appear once in `named_parameters()`, so no special case.
    The split is by layer, not balanced by size: those two fragments carry a vocab
    matrix each on top of their layers (llama_tiny, 4 layers, P=3: 500,352 /
    200,960 / 200,960 parameters; llama_125m, 12 layers, P=4: within 1.4%).
    Raises ValueError for a name that fits none of these or a layer index out
    of range, so a new architecture fails loudly instead of never syncing.
    """
    names = list(names)
    layer_to_frag = {
        layer: f for f, layers in enumerate(strided_fragments(num_layers, num_fragments)) for layer in layers
    }
    out: list[list[str]] = [[] for _ in range(num_fragments)]
    for name in names:
        if m := _LAYER.search(name):
            layer = int(m.group(1))
            if layer not in layer_to_frag:
                raise ValueError(f"parameter {name!r} has layer {layer}, model.num_layers={num_layers}")
            out[layer_to_frag[layer]].append(name)
        elif _FIRST.search(name):
            out[layer_to_frag[0]].append(name)
        elif _LAST.search(name):
            out[layer_to_frag[num_layers - 1]].append(name)
        else:
            raise ValueError(
                f"parameter {name!r} belongs to no fragment (expected layers.N., embed_tokens, norm, lm_head)"
            )
    check_fragments_cover(out, names)
    return out


def check_fragments_cover(fragments: Sequence[Sequence[str]], names: Iterable[str]) -> None:
    """ValueError unless every name is in exactly one fragment and nothing else is."""
    names = list(names)
    seen: dict[str, int] = {}
    for f, frag in enumerate(fragments):
        for n in frag:
            if n in seen:
                raise ValueError(f"fragments: {n!r} is in fragments {seen[n]} and {f}")
            seen[n] = f
    missing = [n for n in names if n not in seen]
    extra = sorted(set(seen) - set(names))
    if missing:
        raise ValueError(f"fragments do not cover the model; missing {missing[:5]} ({len(missing)} in all)")
    if extra:
        raise ValueError(f"fragments name parameters the model lacks: {extra[:5]} ({len(extra)} in all)")


@torch.no_grad()
def mix_(local: Tensors, global_: Tensors, alpha: float = 0.5) -> None:
    """θ_local ← α·θ_local + (1−α)·θ_global, in place (Streaming DiLoCo merge).

    The global update arrives τ inner steps late; keeping α of the local
    weights preserves the progress made during those τ steps.
    """
    for t, g in zip(local, global_, strict=True):
        t.lerp_(g.to(t.dtype), 1.0 - alpha)


def quantize(t: Tensor, kind: QuantKind, chunk: int = 128) -> tuple[Tensor, ...]:
    """Turn a tensor into the flat tensors that go on the wire.

    - "none": (fp32,)
    - "fp16": (fp16,). Values beyond ±65504 become inf; pseudo-gradients are far smaller.
    - "int4": (packed uint8 with two 4-bit codes per byte, fp32 scale, fp32 min)
      with one scale/min per `chunk` elements: min-max uniform quantisation,
      x ≈ min + code·scale, code ∈ [0, 15]. That is 4.5 bits/element at chunk=128.
    """
    flat = t.detach().reshape(-1).float()
    if kind == "none":
        return (flat,)
    if kind == "fp16":
        return (flat.half(),)
    if kind != "int4":
        raise ValueError(f"quantization={kind!r} is unknown; allowed: none, fp16, int4")
    if chunk < 2 or chunk % 2:
        raise ValueError(f"quantization chunk={chunk} must be even and >= 2")
    pad = -flat.numel() % chunk
    if pad:  # repeat the last value so padding cannot widen the last chunk's range
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    x = flat.view(-1, chunk)
    lo = x.amin(dim=1)
    scale = (x.amax(dim=1) - lo) / 15.0
    codes = ((x - lo[:, None]) / scale.clamp_min(torch.finfo(torch.float32).tiny)[:, None]).round_().clamp_(0, 15)
    codes = codes.to(torch.uint8).view(-1, 2)
    packed = codes[:, 0] | (codes[:, 1] << 4)
    return packed, scale, lo


def dequantize(
    payload: Sequence[Tensor], kind: QuantKind, shape: torch.Size | Sequence[int], chunk: int = 128
) -> Tensor:
    """Inverse of `quantize`; always returns fp32 so sums over peers accumulate in fp32."""
    numel = int(torch.Size(shape).numel())
    if kind in ("none", "fp16"):
        return payload[0].float().view(shape)
    if kind != "int4":
        raise ValueError(f"quantization={kind!r} is unknown; allowed: none, fp16, int4")
    packed, scale, lo = payload
    codes = torch.stack([packed & 0xF, packed >> 4], dim=1).view(-1, chunk).float()
    x = lo[:, None] + codes * scale[:, None]
    return x.view(-1)[:numel].view(shape)


def mean_dequantized(
    payloads: Sequence[Sequence[Tensor]], kind: QuantKind, shape: torch.Size | Sequence[int], chunk: int = 128
) -> Tensor:
    """Average several peers' quantized payloads, accumulating in fp32."""
    acc = torch.zeros(shape, dtype=torch.float32, device=payloads[0][0].device)
    for p in payloads:
        acc += dequantize(p, kind, shape, chunk)
    return acc / len(payloads)


# --------------------------------------------------------------------------- NoLoCo


@torch.no_grad()
def noloco_step_(
    phi: Tensors, theta: Tensors, m: Tensors, theta_bar: Tensors, lr: float = 0.7, momentum: float = 0.5
) -> None:
    """NoLoCo outer step with β = γ = η, in place:
        m ← μ·m + η·(θ̄_G − φ) ;  φ ← φ + m ;  θ ← φ
    θ̄_G is the mean of the fast weights over the partner group (self included):
    the only tensor that has to be exchanged.
    """
    for p, t, b, tb in zip(phi, theta, m, theta_bar, strict=True):
        b.mul_(momentum).add_(tb.to(b.dtype) - p, alpha=lr)
        p.add_(b)
        t.copy_(p)


@torch.no_grad()
def noloco_general_step_(
    phi: Tensors,
    theta: Tensors | None,
    delta: Tensors,
    mean_pseudo_grad: Tensors,
    mean_phi: Tensors,
    alpha: float = 0.5,
    beta: float = 0.7,
    gamma: float = 0.7,
) -> None:
    """The paper's form with β and γ separate, in place:
        δ ← α·δ − β·mean_j Δ_j − γ·(φ_i − mean_j φ_j) ;  φ ← φ + δ ;  θ ← φ
    with Δ_j = φ_j − θ_j over the partner group (self included). Because
    mean Δ = mean φ − θ̄, β = γ = η reduces it to `noloco_step_` (α = μ);
    γ ≠ β needs the mean of φ exchanged as well. `theta=None` leaves θ alone (an overlapped
    step moves θ by its own correction, outer/overlap.py).
    """
    for i, (p, d, md, mp) in enumerate(zip(phi, delta, mean_pseudo_grad, mean_phi, strict=True)):
        d.mul_(alpha).sub_(md.to(d.dtype), alpha=beta).sub_(p - mp.to(p.dtype), alpha=gamma)
        p.add_(d)
        if theta is not None:
            theta[i].copy_(p)
