"""NoLoCo with pairing_seed=None averages with the partner the official NoLoCo code would pick."""

import numpy as np
import pytest
import torch

from decentrain.algorithms.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.testing import run_ranks

pytestmark = pytest.mark.dist

H = 4  # the official pairs at step 4 are {0,1},{2,3}; round-keyed default_rng(1) would give {0,2},{1,3}


def official_partner(rank: int, step: int, world_size: int) -> int:
    """The official code: default_rng(step + 1).permutation(N), dealt round-robin into N/2 pairs."""
    perm = [int(x) for x in np.random.default_rng(step + 1).permutation(world_size)]
    half = world_size // 2
    pairs = [(perm[j], perm[j + half]) for j in range(half)]
    return next(b if a == rank else a for a, b in pairs if rank in (a, b))


def _first_sync(world):
    model = torch.nn.Linear(1, 1, bias=False)
    algo = NoLoCo(
        NoLoCoConfig(inner_steps=H, outer_optimizer=OuterOptimizerConfig("noloco", 1.0, 0.0), pairing_seed=None), world
    )
    algo.on_train_start(model, None)  # every replica starts from rank 0's weight
    for step in range(1, H + 1):
        model.weight.data.fill_(float(world.rank + 1))  # θ_i = i + 1 after the inner steps
        algo.after_optimizer_step(step, model, None)
    return model.weight.item()


def test_reference_pairing_picks_the_official_partner_on_4_ranks():
    results = run_ranks(_first_sync, 4)
    for rank, after in enumerate(results):
        # η = 1, μ = 0: φ ← φ + (θ̄ − φ) = θ̄, the mean of this rank and its partner
        partner = official_partner(rank, H, 4)
        assert after == pytest.approx((rank + 1 + partner + 1) / 2)
