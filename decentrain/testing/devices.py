"""A CPU-only guard: every tensor handed to a process group must live on `world.device`.

NCCL needs CUDA tensors and rejects (or, with `torch.cat`, crashes on) a CPU tensor slipped
into a payload; CI has no GPU to show it. Here the `meta` device stands in for CUDA:
run an algorithm with `World(device=meta, backend="nccl")` and a model on meta, with
torch.distributed's collectives and point-to-point calls replaced by fakes that check the
device of every tensor they are handed and then do nothing (the fakes return completed
works). Host reads of meta tensors (`.item()`, `.tolist()`, `int()`, `.cpu()`, a copy to
a host buffer ...) give zeros, so the code after a collective keeps running to its next collective.

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
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "reduce",
    "send",
    "recv",
    "isend",
    "irecv",
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


class _FakeP2POp:
    """dist.P2POp without its default-group lookup (there is no process group here)."""

    def __init__(
        self,
        op: Any,
        tensor: torch.Tensor,
        peer: int | None = None,
        group: Any = None,
        tag: int = 0,
        group_peer: int | None = None,
    ):
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = (
            op,
            tensor,
            peer,
            group,
            tag,
            group_peer,
        )


class _FakeGroup:
    """A process group handle from the patched `new_group` (never used for real traffic)."""

    def __init__(self, ranks: list[int] | None, backend: str | None = None):
        self.ranks = list(ranks or [])
        self.backend = backend


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
    elif isinstance(getattr(obj, "tensor", None), torch.Tensor):  # a P2POp for batch_isend_irecv
        yield obj.tensor


def _flat(obj: Any) -> Iterator[Any]:
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _flat(o)
    else:
        yield obj


def _same_device(t: torch.Tensor, want: torch.device) -> bool:
    return t.device.type == want.type and (want.index is None or t.device.index == want.index)


def _host_zero(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros(t.shape, dtype=t.dtype)


@contextlib.contextmanager
def device_guard(device: torch.device, backend: str = "nccl") -> Iterator[GuardCalls]:
    """Patch torch.distributed (and meta host reads) for the duration; yields the call log.

    `device` is the world's device (meta standing in for CUDA), `backend` the default group's.
    A group from `new_group(backend=...)` keeps its own backend. The rules, per backend:
    nccl takes tensors on `device` only; gloo takes host tensors, and `device` tensors in
    collectives (gloo's CUDA collectives work) but never in point-to-point calls, where a
    CUDA tensor aborts the process (seen on an H100 with torch 2.11: "writev ... Bad address").
    """
    log = GuardCalls(device)
    p2p = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}
    cpu = torch.device("cpu")

    def backend_of(args: tuple, kwargs: dict) -> str:
        groups = [kwargs.get("group")] + [getattr(a, "group", None) for a in _flat(args)]
        for g in groups:
            if isinstance(g, _FakeGroup) and g.backend:
                return g.backend
        return backend

    def allowed(op: str, b: str) -> list[torch.device]:
        if b == "nccl":
            return [device]
        return [cpu] if op in p2p else [cpu, device]

    patches: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, new: Any) -> None:
        patches.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    def fake(op: str):
        def call(*args: Any, **kwargs: Any):
            seen = list(_tensors(list(args) + list(kwargs.values())))
            log.calls.append((op, [(t.device, t.dtype, tuple(t.shape)) for t in seen]))
            b = backend_of(args, kwargs)
            ok = allowed(op, b)
            for t in seen:
                if not any(_same_device(t, d) for d in ok):
                    raise DeviceMismatch(
                        f"dist.{op} got a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}; "
                        f"{b} needs it on {' or '.join(str(d) for d in ok)}"
                    )
            return _DoneWork() if kwargs.get("async_op") or op in ("isend", "irecv") else None

        return call

    c10d = dist.distributed_c10d
    for op in TENSOR_OPS:
        f = fake(op)
        patch(dist, op, f)
        if hasattr(c10d, op):  # P2POp checks its op against c10d's own isend/irecv
            patch(c10d, op, f)

    def batch_isend_irecv(ops: list) -> list[_DoneWork]:
        fake("batch_isend_irecv")(ops)
        return [_DoneWork() for _ in ops]

    patch(dist, "batch_isend_irecv", batch_isend_irecv)
    patch(dist, "P2POp", _FakeP2POp)
    patch(dist, "barrier", lambda *a, **k: None)
    patch(dist, "new_group", lambda ranks=None, *a, **k: _FakeGroup(ranks, k.get("backend")))
    patch(
        dist,
        "get_global_rank",
        lambda group, rank: group.ranks[rank] if isinstance(group, _FakeGroup) and group.ranks else rank,
    )

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
    original_to, original_copy = torch.Tensor.to, torch.Tensor.copy_

    def to(self: torch.Tensor, *args: Any, **kwargs: Any):  # meta -> host (a staging copy): zeros
        if self.is_meta:
            dev, dtype = kwargs.get("device"), kwargs.get("dtype")
            for a in args:
                if isinstance(a, (torch.device, str)):
                    dev = torch.device(a)
                elif isinstance(a, torch.dtype):
                    dtype = a
                elif isinstance(a, torch.Tensor):
                    dev, dtype = a.device, a.dtype
            if dev is not None and torch.device(dev).type == "cpu":
                return torch.zeros(self.shape, dtype=dtype or self.dtype)
        return original_to(self, *args, **kwargs)

    def copy_(self: torch.Tensor, src: torch.Tensor, *args: Any, **kwargs: Any):
        if isinstance(src, torch.Tensor) and src.is_meta and not self.is_meta:
            return self.zero_()
        return original_copy(self, src, *args, **kwargs)

    patch(torch.Tensor, "to", to)
    patch(torch.Tensor, "copy_", copy_)
    for dunder in ("__int__", "__float__", "__bool__", "__index__"):
        patch(torch.Tensor, dunder, meta_or(dunder, lambda t, _d=dunder: getattr(_host_zero(t), _d)()))
    try:
        yield log
    finally:
        for obj, name, old in reversed(patches):
            setattr(obj, name, old)
