"""Start-up checks and weight broadcast shared by the replica algorithms (DiLoCo, NoLoCo).

Both run once, before the first inner step; they are the only collectives NoLoCo
issues over the whole world. The shape check gathers a fixed-size fingerprint, so
replicas with different models fail with a clear error instead of hanging in a
broadcast of mismatched buffers.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from decentrain.core.world import World


def model_fingerprint(model: torch.nn.Module) -> list[int]:
    """[number of tensors, number of elements, 62-bit hash of names, shapes and dtypes]."""
    params = list(model.named_parameters())
    text = ";".join(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in params)
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2
    return [len(params), sum(p.numel() for _, p in params), digest]


def check_replicas_match(world: World, model: torch.nn.Module) -> None:
    """ValueError on every rank unless all replicas hold the same parameter shapes."""
    if not world.is_distributed:
        return
    mine = torch.tensor(model_fingerprint(model), dtype=torch.int64, device=world.device)
    everyone = [torch.zeros_like(mine) for _ in range(world.world_size)]
    dist.all_gather(everyone, mine, group=world.group)
    prints = [tuple(int(x) for x in t.tolist()) for t in everyone]
    if len(set(prints)) > 1:
        ref = prints[0]
        odd = [r for r, p in enumerate(prints) if p != ref]
        raise ValueError(
            f"model: replicas disagree on parameter shapes (rank 0 has {ref[0]} tensors / {ref[1]} elements; "
            f"ranks {odd} differ: {[prints[r][:2] for r in odd]}); every replica must build the same model config"
        )


@torch.no_grad()
def broadcast_parameters(world: World, model: torch.nn.Module, src: int = 0) -> None:
    """Every replica starts from rank `src`'s weights (and buffers)."""
    if not world.is_distributed:
        return
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, group_src=src, group=world.group)  # src: a rank of world.group
