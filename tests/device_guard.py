"""A CPU-only guard: every tensor handed to a process group must live on `world.device`.

NCCL needs CUDA tensors and rejects (or, with `torch.cat`, crashes on) a CPU tensor slipped
into a payload; CI has no GPU to show it. Here the `meta` device stands in for CUDA:
run an algorithm with `World(device=meta, backend="nccl")` and a model on meta, with
torch.distributed's collectives and point-to-point calls replaced by fakes that check the
device of every tensor they are handed and then do nothing (the fakes return completed
works). Host reads of meta tensors (`.item()`, `.tolist()`, `int()`, `.cpu()` ...) give
zeros, so the code after a collective keeps running to its next collective.

    with device_guard(torch.device("meta")) as calls:
        algorithm.after_optimizer_step(...)
    assert "all_reduce" in calls.ops
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.distributed as dist

# Every torch.distributed entry point that takes tensors (collectives and point-to-point).
TENSOR_OPS = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "gather", "scatter", "reduce", "send", "recv", "isend", "irecv",
)


class DeviceMismatch(AssertionError):
    pass


class _DoneWork:
    """What an async collective returns: already complete."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


class _FakeGroup:
    """A process group handle from the patched `new_group` (never used for real traffic)."""

    def __init__(self, ranks: list[int] | None):
        self.ranks = list(ranks or [])


@dataclass
class GuardCalls:
    """What the guarded code handed to torch.distributed: (op, [(device, dtype, shape)])."""

    device: torch.device
    calls: list[tuple[str, list[tuple[torch.device, torch.dtype, tuple[int, ...]]]]] = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        return [op for op, _ in self.calls]


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dist.P2POp):
        yield obj.tensor


def _same_device(t: torch.Tensor, want: torch.device) -> bool:
    return t.device.type == want.type and (want.index is None or t.device.index == want.index)


def _host_zero(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype)


@contextlib.contextmanager
def device_guard(device: torch.device) -> Iterator[GuardCalls]:
    """Patch torch.distributed (and meta host reads) for the duration; yields the call log."""
    log = GuardCalls(device)
    patches: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, new: Any) -> None:
        patches.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    def fake(op: str):
        def call(*args: Any, **kwargs: Any):
            seen = list(_tensors(list(args) + list(kwargs.values())))
            log.calls.append((op, [(t.device, t.dtype, tuple(t.shape)) for t in seen]))
            for t in seen:
                if not _same_device(t, device):
                    raise DeviceMismatch(f"dist.{op} got a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}; "
                                         f"the backend needs {device}")
            return _DoneWork() if kwargs.get("async_op") or op in ("isend", "irecv") else None
        return call

    for op in TENSOR_OPS:
        patch(dist, op, fake(op))
    def batch_isend_irecv(ops: list) -> list[_DoneWork]:
        fake("batch_isend_irecv")(ops)
        return [_DoneWork() for _ in ops]

    patch(dist, "batch_isend_irecv", batch_isend_irecv)
    patch(dist, "barrier", lambda *a, **k: None)
    patch(dist, "new_group", lambda ranks=None, *a, **k: _FakeGroup(ranks))
    patch(dist, "get_global_rank", lambda group, rank: group.ranks[rank] if isinstance(group, _FakeGroup) and group.ranks else rank)

    # host reads of meta tensors: zeros of the right shape, so the code after a collective runs on
    def meta_or(name: str, on_meta):
        original = getattr(torch.Tensor, name)

        def method(self, *args: Any, **kwargs: Any):
            return on_meta(self, *args, **kwargs) if self.is_meta else original(self, *args, **kwargs)
        return method

    patch(torch.Tensor, "item", meta_or("item", lambda t: _host_zero(t).item()))
    patch(torch.Tensor, "tolist", meta_or("tolist", lambda t: _host_zero(t).tolist()))
    patch(torch.Tensor, "cpu", meta_or("cpu", lambda t, *a, **k: _host_zero(t)))
    patch(torch.Tensor, "numpy", meta_or("numpy", lambda t, *a, **k: _host_zero(t).numpy()))
    for dunder in ("__int__", "__float__", "__bool__", "__index__"):
        patch(torch.Tensor, dunder, meta_or(dunder, lambda t, _d=dunder: getattr(_host_zero(t), _d)()))
    try:
        yield log
    finally:
        for obj, name, old in reversed(patches):
            setattr(obj, name, old)
