"""SPO tracker options: per-round or per-observation discounting, initial baseline, reward clamp (hand-computed)."""

import pytest
import torch

from decentrain.algorithms.sapo.grpo import SAPOLossConfig, SPOTracker, build_advantage_estimator


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b), atol=tol, rtol=0)


def tracker(discount, init="group", rho=0.5):
    spo = SPOTracker(rho=rho, discount=discount, init=init)
    spo.load_state_dict({"rho": rho, "alpha": {"p": 1.0}, "beta": {"p": 1.0}})  # v(p) = .5
    return spo


def test_per_observation_discounting_is_spos_update_applied_to_each_completion():
    spo = tracker("observation")
    spo.update("p", [1.0, 0.0, 1.0])
    # r=1: a = .5·1 + 1 = 1.5, b = .5·1 = .5;  r=0: a = .75, b = 1.25;  r=1: a = 1.375, b = .625
    assert (spo.alpha["p"], spo.beta["p"]) == (pytest.approx(1.375), pytest.approx(0.625))
    assert spo.value("p") == pytest.approx(0.6875)


def test_per_round_discounting_discounts_the_group_once():
    spo = tracker("round")
    spo.update("p", [1.0, 0.0, 1.0])
    # a = .5·1 + 2 = 2.5, b = .5·1 + 1 = 1.5
    assert (spo.alpha["p"], spo.beta["p"]) == (pytest.approx(2.5), pytest.approx(1.5))
    assert spo.value("p") == pytest.approx(0.625)


def test_config_selects_the_options():
    spo = build_advantage_estimator(SAPOLossConfig(advantage="spo", spo_discount="observation", spo_init="prior"))
    assert (spo.discount, spo.init) == ("observation", "prior")
    assert SAPOLossConfig().spo_discount == "round" and SAPOLossConfig().spo_init == "group"
    with pytest.raises(ValueError, match=r"spo_discount='step' is unknown; allowed: \['round', 'observation'\]"):
        SAPOLossConfig(spo_discount="step")
    with pytest.raises(ValueError, match=r"spo_init='zero' is unknown; allowed: \['group', 'prior'\]"):
        SAPOLossConfig(spo_init="zero")


def test_prior_init_uses_spos_half_baseline_for_unseen_prompts():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    # prior: baselines .5, .5 -> raw [.5 .5 -.5 .5], mean .25, centred [.25 .25 -.75 .25], std .5
    spo = SPOTracker(rho=0.5, discount="round", init="prior")
    s = 0.5 + 1e-4
    close(spo(["p", "q"], rewards), [[0.25 / s, 0.25 / s], [-0.75 / s, 0.25 / s]])
    # then updated from a = b = .5: p: a = .25 + 2, b = .25 -> .9; q: a = .25 + 1, b = .25 + 1 -> .5
    assert spo.value("p") == pytest.approx(0.9) and spo.value("q") == pytest.approx(0.5)
    # group: baselines are the group means 1 and .5 -> raw [0 0 -.5 .5], std sqrt(.5/3) = .408248
    g = SPOTracker(rho=0.5, discount="round", init="group")
    s = 0.408248 + 1e-4
    close(g(["p", "q"], rewards), [[0.0, 0.0], [-0.5 / s, 0.5 / s]])


def test_prior_init_with_per_observation_discounting():
    spo = SPOTracker(rho=0.5, discount="observation", init="prior")
    spo.update("p", [1.0, 1.0])
    # from .5/.5: r=1: a = 1.25, b = .25; r=1: a = 1.625, b = .125
    assert spo.value("p") == pytest.approx(1.625 / 1.75)


def test_advantage_uses_the_raw_reward_and_the_tracker_the_clamped_one():
    spo = SPOTracker(rho=0.5, discount="round", init="prior")
    adv = spo(["p", "q"], torch.tensor([[1.5, 0.5], [0.0, 0.0]]))
    # raw A = r - .5: [1, 0, -.5, -.5], mean 0, std sqrt(1.5/3) = .707107
    s = 0.707107 + 1e-4
    close(adv, [[1.0 / s, 0.0], [-0.5 / s, -0.5 / s]])
    # tracker sees [1, .5]: a = .25 + 1.5 = 1.75, b = .25 + .5 = .75
    assert spo.value("p") == pytest.approx(0.7)
