"""One-step-delayed (overlapped) outer updates for DiLoCo and NoLoCo (`algorithm.overlap=true`).

The exchange of round r runs while round r+1's inner steps compute; it lands (the outer step
on the slow weights φ) at the end of round r+1. The schedule is PCCL's async DiLoCo, the
one-step-delayed outer update Prime Intellect uses to hide its syncs (Keiblinger et al., arXiv
2505.14065, "Async DiLoCo"; Kale et al., arXiv 2502.12996, study the same one-outer-step
overlap). How the progress made meanwhile is kept is written out below as this module's own
equation (Streaming DiLoCo's merge θ ← α·θ + (1−α)·φ instead drops a share 1−α of it); it
covers NoLoCo's gossip step as well as DiLoCo's all-reduce.

The correction the delay needs. Each replica keeps a base b: its weights right after the last
correction, which is also exactly what it sent (DiLoCo sends Δ = φ − b, NoLoCo sends b). While
round r+1 computes, θ − b is the replica's own progress since it sent, on top of the old φ.
When round r's exchange lands and moves φ_{r−1} → φ_r, that progress is kept and moved onto
the new slow weights:

    θ ← φ_r + (θ − b) ;  b ← θ

so after every correction θ = φ_r − Δ_{r+1}: the synchronous algorithm's fast weights, had
round r+1 started from φ_r. Round r+1's exchange then carries exactly what the synchronous
algorithm would exchange for those weights (DiLoCo: Δ_{r+1} = φ_r − θ = b − θ before the
correction; NoLoCo: θ), and the only approximation is that round r+1's inner steps ran from
φ_{r−1} − Δ_r instead of φ_r (one outer step late). Replicas stay consistent: θ − b on each
is its own progress, φ is what the exchanges made of everybody's.

A checkpoint does not wait for the round in flight: it saves b (and φ, unchanged since the
send), from which the payload is rebuilt bit for bit, and the resumed run sends it again.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

Tensors = Sequence[Tensor]


@torch.no_grad()
def delayed_correction_(theta: Tensors, phi: Tensors, base: Tensors) -> None:
    """θ ← φ + (θ − b) ; b ← θ, in place (fp32 arithmetic, θ's dtype kept). See the module docstring.

    Summed in this order so that a replica with no progress since it sent (θ = b) lands on φ exactly,
    the same bits on every replica (θ + (φ − b) would round differently on each)."""
    for t, p, b in zip(theta, phi, base, strict=True):
        t.copy_(p.float() + (t.float() - b.float()))
        b.copy_(t)


def check_overlap(cfg: Any) -> None:
    """Config-time checks of `algorithm.overlap` (an InnerOuterConfig with an `overlap` field)."""
    if cfg.overlap and cfg.adaptive_inner_steps:
        raise ValueError(
            "algorithm.overlap=true cannot pace inner steps (a delayed round has no common end to "
            "pace to); allowed: algorithm.adaptive_inner_steps=false"
        )


class DelayedOuter:
    """The base b of the one-step-delayed update, in the weights' dtype (it is θ exactly after a correction)."""

    def __init__(self, params: Tensors):
        self.base = [p.detach().clone() for p in params]

    def correct(self, theta: Tensors, phi: Tensors) -> None:
        delayed_correction_(theta, phi, self.base)

    def state_dict(self) -> dict[str, Any]:
        return {"base": [b.clone() for b in self.base]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["base"]
        if len(saved) != len(self.base) or any(s.shape != b.shape for s, b in zip(saved, self.base)):
            raise ValueError("the checkpoint's overlap base does not match the model's parameters")
        for b, s in zip(self.base, saved):
            b.copy_(s)


class Background:
    """One blocking call at a time, on a helper thread (NoLoCo's pair exchange during the next round)."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
