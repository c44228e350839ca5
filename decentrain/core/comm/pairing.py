"""Gossip pairing: every rank derives the same random matching for round t from a shared seed.

No messages are needed to agree on partners; the exchange itself lives in `core/comm/pair_exchange.py`.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np

OddPolicy = Literal["idle", "triple", "error"]
ODD_POLICIES = ("idle", "triple", "error")


def gossip_groups(
    round_idx: int,
    world_size: int,
    seed: int | None = None,
    odd: OddPolicy = "error",
    *,
    inner_steps: int | None = None,
) -> list[tuple[int, ...]]:
    """The random matching of round `round_idx` (0-based): disjoint groups covering 0..world_size-1.

    Two streams, both `rng.permutation(N)` with pairs {perm[j], perm[j + N/2]}:
    - `seed=None`: the official NoLoCo code's sequence. It keys the permutation by the
      inner-step counter at the sync, `default_rng(k·H + 1)` at the k-th sync (k = round_idx + 1),
      so it needs `inner_steps=H`. Every rank must pass the same H (the configured one, also
      when adaptive pacing runs fewer steps on a slow rank).
    - an int seed: `default_rng([seed, round_idx])`, decentrain's own stream, independent per
      seed (not the reference sequence).

    Odd worlds: `idle` leaves the last rank of the permutation alone for the round
    (a singleton group that keeps its own weights); `triple` adds it to the first pair;
    `error` refuses.
    """
    if seed is None and (inner_steps is None or inner_steps < 1):
        raise ValueError(
            f"inner_steps={inner_steps}: the reference pairing (seed=None) is keyed by k*H and needs H >= 1"
        )
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if odd not in ODD_POLICIES:
        raise ValueError(f"odd={odd!r} is unknown; allowed: {list(ODD_POLICIES)}")
    if world_size % 2 and odd == "error" and world_size > 1:
        raise ValueError(
            f"world_size={world_size} is odd and cannot be paired; set the odd-world policy to 'idle' or 'triple'"
        )
    rng = np.random.default_rng((round_idx + 1) * inner_steps + 1 if seed is None else [seed, round_idx])
    perm = [int(p) for p in rng.permutation(world_size)]
    half = world_size // 2
    groups: list[tuple[int, ...]] = [(perm[j], perm[j + half]) for j in range(half)]
    if world_size % 2:
        last = perm[-1]
        if odd == "triple" and groups:
            groups[0] = groups[0] + (last,)
        else:
            groups.append((last,))
    return groups


def group_of(rank: int, groups: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    for g in groups:
        if rank in g:
            return g
    raise ValueError(f"rank {rank} is in no group of {groups}")
