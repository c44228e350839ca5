"""Collectives over raw bytes that never unpickle.

`all_gather_object` / `broadcast_object_list` unpickle what peers send, which lets a
hostile peer run code. These move uint8 tensors instead; decoding and validation of
the bytes is the caller's job (e.g. a versioned JSON schema).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist

from decentrain.core.world import World

logger = logging.getLogger(__name__)


class PayloadTooLarge(ValueError):
    pass


def _to_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        if data
        else torch.empty(0, dtype=torch.uint8, device=device)
    )


class GatheredBytes(list):
    """`all_gather_bytes`'s result: one bytes per rank, in rank order, plus the ranks dropped.

    `dropped` lists the ranks whose announced size exceeded the cap (or was negative): their
    slot is b"" and nothing of their announced size was allocated.
    """

    def __init__(self, items, dropped: list[int] | None = None):
        super().__init__(items)
        self.dropped: list[int] = list(dropped or [])


def all_gather_bytes(world: World, data: bytes, max_bytes: int = 64 << 20) -> GatheredBytes:
    """Every rank contributes `data`; every rank receives all ranks' bytes, in rank order.

    Sizes are exchanged first and checked against `max_bytes` on receipt, before any buffer
    is allocated: a peer announcing more (a hostile or broken one, say 1 TiB) is dropped, its
    slot returns b"" and its rank is listed in `.dropped`; the call never raises for what a
    peer announces. A rank whose own payload exceeds `max_bytes` contributes b"" (so the
    collective still completes on every rank), then raises PayloadTooLarge itself.
    """
    oversized = len(data) > max_bytes
    if oversized:
        data = b""
    if not world.is_distributed:
        out = GatheredBytes([data])
    else:
        out = _gather(world, data, max_bytes)
    if oversized:
        raise PayloadTooLarge(f"payload exceeds max_bytes={max_bytes}; contributed nothing this round")
    return out


def accepted_lengths(lengths: list[int], max_bytes: int) -> tuple[list[int], list[int]]:
    """Announced sizes -> (sizes to receive, dropped ranks). Every rank computes the same from the
    same announcements, so the data all_gather that follows has one agreed width."""
    dropped = [r for r, n in enumerate(lengths) if n < 0 or n > max_bytes]
    return [0 if r in dropped else n for r, n in enumerate(lengths)], dropped


def _gather(world: World, data: bytes, max_bytes: int) -> GatheredBytes:
    n = world.world_size
    size = torch.tensor([len(data)], dtype=torch.int64, device=world.device)
    sizes = [torch.zeros_like(size) for _ in range(n)]
    dist.all_gather(sizes, size, group=world.group)
    lengths, dropped = accepted_lengths([int(s.item()) for s in sizes], max_bytes)
    if dropped:
        logger.warning("all_gather_bytes: dropped rank(s) %s announcing more than max_bytes=%d", dropped, max_bytes)
    width = max(lengths)  # over-cap announcements never size a buffer
    if width == 0:
        return GatheredBytes([b""] * n, dropped)
    buf = torch.zeros(width, dtype=torch.uint8, device=world.device)
    buf[: len(data)] = _to_tensor(data, world.device)
    out = [torch.empty(width, dtype=torch.uint8, device=world.device) for _ in range(n)]
    dist.all_gather(out, buf, group=world.group)
    return GatheredBytes([t[:length].cpu().numpy().tobytes() for t, length in zip(out, lengths)], dropped)


def broadcast_bytes(world: World, data: bytes | None, src: int = 0, max_bytes: int = 1 << 20) -> bytes:
    """Rank `src` sends `data`; every rank returns it."""
    if not world.is_distributed:
        assert data is not None
        return data
    size = torch.tensor([len(data) if world.rank == src else 0], dtype=torch.int64, device=world.device)
    dist.broadcast(size, src=src, group=world.group)
    length = int(size.item())
    if length > max_bytes:
        raise PayloadTooLarge(f"broadcast of {length} bytes exceeds max_bytes={max_bytes}")
    buf = (
        _to_tensor(data, world.device)
        if world.rank == src
        else torch.empty(length, dtype=torch.uint8, device=world.device)
    )
    dist.broadcast(buf, src=src, group=world.group)
    return buf.cpu().numpy().tobytes()


def agree_run_dir(world: World, run_dir: str | Path) -> Path:
    """Rank 0's run dir, on every rank.

    Under torchrun each rank composes its own timestamped Hydra dir; a rank whose clock
    read a second off rank 0's removes the empty dir Hydra made for it.
    """
    own = Path(run_dir).resolve()
    if not world.is_distributed:
        return own
    agreed = Path(broadcast_bytes(world, str(own).encode() if world.is_main else None).decode())
    if own != agreed and own.is_dir() and not any(own.iterdir()):
        own.rmdir()
    return agreed
