"""Ensemble dispatch: place K experts on ranks, score a batch with each, gather per-token log-probs.

Mixing the gathered log-probs (posterior weights, top-k, averages) is the ensemble
algorithm's business; this module only moves tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from decentrain.core.world import World


@dataclass(frozen=True)
class ExpertPlacement:
    """Round-robin placement: expert k lives on rank k % world_size."""

    num_experts: int
    world_size: int

    def __post_init__(self) -> None:
        if self.num_experts < 1:
            raise ValueError(f"num_experts={self.num_experts} must be >= 1")

    def experts_on(self, rank: int) -> list[int]:
        return list(range(rank, self.num_experts, self.world_size))

    @property
    def slots(self) -> int:
        """Experts per rank, padded to the busiest rank (all-gather needs equal shapes)."""
        return -(-self.num_experts // self.world_size)


@torch.no_grad()
def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(x_t | x_<t) for t = 1..T-1 of each row: shape [B, T-1]."""
    logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def gather_expert_logprobs(world: World, placement: ExpertPlacement, local: dict[int, torch.Tensor]) -> torch.Tensor:
    """All-gather the per-token log-probs of every expert: returns [K, B, T] in expert order.

    `local` maps each expert index placed on this rank to its [B, T] log-probs.
    """
    mine = placement.experts_on(world.rank)
    if sorted(local) != mine:
        raise ValueError(f"rank {world.rank} holds experts {mine} but got log-probs for {sorted(local)}")
    if not world.is_distributed:
        return torch.stack([local[k] for k in range(placement.num_experts)])
    shape = next(iter(local.values())).shape if local else None
    # ranks without an expert still join the collective, so agree on the shape first
    dims = torch.tensor(list(shape) if shape else [0, 0], dtype=torch.int64, device=world.device)
    dist.all_reduce(dims, op=dist.ReduceOp.MAX, group=world.group)
    B, T = (int(d) for d in dims)
    buf = torch.zeros(placement.slots, B, T, device=world.device)
    for slot, k in enumerate(mine):
        buf[slot] = local[k].to(world.device).float()
    out = [torch.empty_like(buf) for _ in range(world.world_size)]
    dist.all_gather(out, buf, group=world.group)
    return torch.stack([out[k % world.world_size][k // world.world_size] for k in range(placement.num_experts)])
