"""A NoLoCo rank that fell BEHIND+ rounds behind the live ones jumps one round past them.

Jumping to the live round itself lost the race in CI: the live ranks finished that round while the
lagging rank ran its next inner steps, so it arrived after its partner had left, was skipped as
"already past", and stayed 1-2 rounds behind (under BEHIND, so it never jumped again).
"""

from __future__ import annotations

import torch

from decentrain.algorithms.noloco.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.core.comm.inprocess_transport import InProcessHub
from decentrain.core.comm.wait_policy import BEHIND
from decentrain.core.world import World


def _lagging_rank(live: int):
    hub = InProcessHub(2, 0.1)  # rank 1 never comes: a round with no jump ends at once
    model = torch.nn.Linear(1, 1, bias=False)
    cfg = NoLoCoConfig(inner_steps=2, outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.0))
    algo = NoLoCo(cfg, World(rank=0, world_size=2))
    algo.transport = transport = hub.transport(0)
    published, skipped = [], []
    transport.live_round = lambda: live  # the other ranks' median rounds done
    transport.publish = lambda done, finished=False: published.append(done)
    transport.skip_round = lambda group, r: skipped.append(r)
    algo.on_train_start(model, None)
    return model, algo, published, skipped


def test_a_lagging_rank_rejoins_one_round_past_the_live_ranks():
    live = BEHIND + 5
    model, algo, published, skipped = _lagging_rank(live)
    algo.after_optimizer_step(1, model, None)
    m = algo.after_optimizer_step(2, model, None)  # round 0 ends: live - 0 >= BEHIND
    assert skipped == list(range(live + 1))  # one header per round up to and including the live one
    assert algo.round == live + 1 and published[-1] == live + 1  # old code: live, behind a partner gone
    assert m["outer/rounds_jumped"] == live + 1 and m["outer/partner_missed"] == 1.0
    assert algo.steps_skipped == live * algo.cfg.inner_steps  # round 0's inner steps were run


def test_a_rank_under_behind_rounds_behind_does_not_jump():
    model, algo, published, skipped = _lagging_rank(BEHIND - 1)
    algo.after_optimizer_step(1, model, None)
    m = algo.after_optimizer_step(2, model, None)
    assert skipped == [] and algo.round == 1 and m["outer/rounds_jumped"] == 0
