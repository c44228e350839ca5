"""Collectives over raw bytes that never unpickle.

`all_gather_object` / `broadcast_object_list` unpickle what peers send, which lets a
hostile peer run code. These move uint8 tensors instead; decoding and validation of
the bytes is the caller's job (e.g. a versioned JSON schema).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from decentrain.core.world import World


class PayloadTooLarge(ValueError):
    pass


def _to_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else torch.empty(0, dtype=torch.uint8, device=device)


def all_gather_bytes(world: World, data: bytes, max_bytes: int = 64 << 20) -> list[bytes]:
    """Every rank contributes `data`; every rank receives all ranks' bytes, in rank order.

    Sizes are exchanged first. A rank whose payload exceeds `max_bytes` contributes b""
    (so nobody allocates a huge buffer and the collective still completes on every rank),
    then raises PayloadTooLarge itself.
    """
    oversized = len(data) > max_bytes
    if oversized:
        data = b""
    if not world.is_distributed:
        out = [data]
    else:
        out = _gather(world, data)
    if oversized:
        raise PayloadTooLarge(f"payload exceeds max_bytes={max_bytes}; contributed nothing this round")
    return out


def _gather(world: World, data: bytes) -> list[bytes]:
    n = world.world_size
    size = torch.tensor([len(data)], dtype=torch.int64, device=world.device)
    sizes = [torch.zeros_like(size) for _ in range(n)]
    dist.all_gather(sizes, size, group=world.group)
    lengths = [int(s.item()) for s in sizes]
    width = max(lengths)
    if width == 0:
        return [b""] * n
    buf = torch.zeros(width, dtype=torch.uint8, device=world.device)
    buf[: len(data)] = _to_tensor(data, world.device)
    out = [torch.empty(width, dtype=torch.uint8, device=world.device) for _ in range(n)]
    dist.all_gather(out, buf, group=world.group)
    return [t[:length].cpu().numpy().tobytes() for t, length in zip(out, lengths)]


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
    buf = _to_tensor(data, world.device) if world.rank == src else torch.empty(length, dtype=torch.uint8, device=world.device)
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
