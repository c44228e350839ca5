"""NoLoCo hook on one process (the pair is just this replica) and its config checks."""

import math

import pytest
import torch

from decentrain.algorithms.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.algorithms.pretraining.inner_outer import StepPace
from decentrain.core.world import World


def test_bad_config_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="algorithm.inner_steps=0"):
        NoLoCoConfig(inner_steps=0)
    with pytest.raises(ValueError, match="algorithm.odd_world='pair'.*allowed"):
        NoLoCoConfig(odd_world="pair")
    with pytest.raises(ValueError, match="algorithm.odd_world"):
        NoLoCo.check_world(NoLoCoConfig(), 3)
    NoLoCo.check_world(NoLoCoConfig(odd_world="idle"), 3)
    NoLoCo.check_world(NoLoCoConfig(), 4)


def test_alone_the_outer_step_is_momentum_on_own_drift():
    model = torch.nn.Linear(1, 1, bias=False)
    model.weight.data.fill_(1.0)
    algo = NoLoCo(
        NoLoCoConfig(inner_steps=1, outer_optimizer=OuterOptimizerConfig("noloco", lr=0.5, momentum=0.5)), World()
    )
    algo.on_train_start(model, None)
    model.weight.data.fill_(3.0)  # θ̄ = θ = 3, φ = 1: m = 0.5·2 = 1, φ = 2, θ = 2
    algo.after_optimizer_step(1, model, None)
    assert model.weight.item() == pytest.approx(2.0)
    model.weight.data.fill_(2.0)  # no drift: m = 0.5, φ = θ = 2.5
    algo.after_optimizer_step(2, model, None)
    assert model.weight.item() == pytest.approx(2.5)
    state = algo.state_dict()
    assert state["round"] == 2 and state["outer"]["opt"]["state"][0]["momentum_buffer"].item() == pytest.approx(0.5)


def test_gamma_not_beta_uses_the_general_form():
    model = torch.nn.Linear(1, 1, bias=False)
    model.weight.data.fill_(1.0)
    algo = NoLoCo(
        NoLoCoConfig(inner_steps=1, outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.5), gamma=0.2), World()
    )
    algo.on_train_start(model, None)
    model.weight.data.fill_(3.0)  # alone: mean φ = φ, mean Δ = 1 − 3 = −2: δ = −0.5·(−2) = 1
    algo.after_optimizer_step(1, model, None)
    assert model.weight.item() == pytest.approx(2.0)


def test_pace_scales_h_to_the_fastest_worker():
    pace = StepPace()
    assert pace.inner_steps(50, 1) == 50  # nothing measured yet
    for _ in range(5):
        pace.observe(0.2)
    pace.hear(0.05)
    assert pace.inner_steps(40, 1) == 10 and pace.inner_steps(40, 20) == 20
    pace.hear(math.inf)
    assert pace.fastest == 0.05
