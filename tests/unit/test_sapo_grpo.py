import json
import math

import pytest
import torch

from decentrain.algorithms.sapo.grpo import (
    GroupAdvantage,
    LossNorm,
    SAPOLossConfig,
    SPOTracker,
    build_advantage_estimator,
    group_advantages,
    kl_k3,
    policy_loss,
)

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b), atol=tol, rtol=0)


# --- config -------------------------------------------------------------------------------------


def test_config_defaults_follow_trl_and_the_paper():
    cfg = SAPOLossConfig()
    assert (cfg.epsilon, cfg.epsilon_high, cfg.beta, cfg.loss_type) == (0.2, 0.28, 0.0, "dapo")
    assert cfg.scale_rewards == "group" and cfg.advantage == "group" and cfg.spo_rho == 0.875


def test_scale_rewards_bools_map_like_trl():
    assert SAPOLossConfig(scale_rewards=True).scale_rewards == "group"
    assert SAPOLossConfig(scale_rewards=False).scale_rewards == "none"


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(loss_type="sapo"), r"loss_type='sapo' is unknown; allowed: \['dapo', 'bnpo', 'grpo', 'dr_grpo'\]"),
        (dict(scale_rewards="std"), r"scale_rewards='std' is unknown; allowed: \['group', 'batch', 'none'\]"),
        (dict(advantage="ppo"), r"advantage='ppo' is unknown; allowed: \['group', 'spo'\]"),
        (dict(num_generations=1), "num_generations"),
        (dict(epsilon=-0.1), "epsilon"),
        (dict(num_iterations=0), "num_iterations"),
        (dict(spo_rho=0.0), "spo_rho"),
    ],
)
def test_bad_config_names_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        SAPOLossConfig(**kw)


# --- group advantages ---------------------------------------------------------------------------


def test_group_advantages_hand_computed():
    # group 0: mean .5, unbiased std sqrt(1/3) = .577350; group 1: mean .75, std .5
    a = 0.5 / (0.577350 + 1e-4)
    close(group_advantages(REWARDS, "group"), [[a, -a, -a, a], [0.25 / 0.5001] * 3 + [-0.75 / 0.5001]])
    close(group_advantages(REWARDS, "none"), [[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]])
    # batch std of all 8 rewards (5 ones, 3 zeros): sqrt(1.875 / 7) = .517549
    s = 0.517549 + 1e-4
    close(group_advantages(REWARDS, "batch"), [[0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], [0.25 / s] * 3 + [-0.75 / s]])


def test_equal_rewards_give_zero_advantage():
    close(group_advantages(torch.ones(1, 4)), [[0.0] * 4])


def test_registry_builds_estimators():
    assert isinstance(build_advantage_estimator(SAPOLossConfig()), GroupAdvantage)
    spo = build_advantage_estimator(SAPOLossConfig(advantage="spo", spo_rho=0.5))
    assert isinstance(spo, SPOTracker) and spo.rho == 0.5


# --- SPO tracker --------------------------------------------------------------------------------


def test_spo_tracker_hand_computed():
    spo = SPOTracker(rho=0.5)
    spo.load_state_dict({"rho": 0.5, "alpha": {"p": 1.0}, "beta": {"p": 1.0}})  # v(p) = .5
    adv = spo(["p", "q"], torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]]))
    # p: baseline .5 (before the update) -> [.5 .5 -.5 .5]; then a = .5*1 + 3, b = .5*1 + 1
    # q: unseen, initialised from its own group: a = 1, b = 3 -> baseline .25 -> [-.25 -.25 -.25 .75]
    # batch mean .125, centred [.375 .375 -.625 .375 -.375 -.375 -.375 .625], std sqrt(1.625/7) = .481812
    s = 0.481812 + 1e-4
    close(adv, [[0.375 / s, 0.375 / s, -0.625 / s, 0.375 / s], [-0.375 / s] * 3 + [0.625 / s]])
    assert spo.value("p") == pytest.approx(0.7) and spo.value("q") == pytest.approx(0.25)
    assert spo.value("never") is None


def test_spo_tracker_clamps_rewards_and_discounts_once_per_round():
    spo = SPOTracker(rho=0.875)
    spo.update("p", [1.5, -1.0])  # clamped to [1, 0]
    spo.update("p", [1.0, 1.0])
    assert spo.alpha["p"] == pytest.approx(0.875 * 1 + 2) and spo.beta["p"] == pytest.approx(0.875 * 1)


def test_spo_prioritised_sampling_weights():
    spo = SPOTracker(rho=0.5)
    spo.load_state_dict({"rho": 0.5, "alpha": {"p": 7.0, "q": 1.0}, "beta": {"p": 3.0, "q": 3.0}})  # v = .7, .25
    w = spo.sampling_weights(["p", "q", "new"], eps=0.05)
    raw = [math.sqrt(0.21) + 0.05, math.sqrt(0.1875) + 0.05, 0.5 + 0.05]  # .508258 .483013 .55
    close(w, [x / sum(raw) for x in raw])


def test_spo_state_dict_is_json():
    spo = SPOTracker(rho=0.875)
    spo(["a", "b"], REWARDS)
    state = json.loads(json.dumps(spo.state_dict()))
    other = SPOTracker()
    other.load_state_dict(state)
    assert other.state_dict() == spo.state_dict()


# --- loss ---------------------------------------------------------------------------------------

# ratios pi/pi_old per token; row 0 has advantage +1, row 1 advantage -2; row 1's last token is padding
RATIOS = torch.tensor([[1.5, 0.5, 1.0], [1.1, 0.7, 2.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0])
# per-token -min(r*A, clip(r, .8, 1.28)*A): row 0 [-1.28, -.5, -1.0]; row 1 [2.2, 1.6, (4.0 masked)]


def run_loss(loss_type, rows=slice(None), norm=None, **kw):
    logps = torch.log(RATIOS[rows]).clone().requires_grad_(True)
    cfg = SAPOLossConfig(loss_type=loss_type, max_completion_length=4, **kw)
    norm = norm or LossNorm.from_mask(MASK, micro_batch_size=2)
    loss, stats = policy_loss(logps, ADV[rows], MASK[rows], cfg, norm, old_logps=torch.zeros_like(logps))
    return loss, stats, logps


@pytest.mark.parametrize(
    "loss_type, expected",
    [
        ("dapo", 1.02 / 5),  # token-mean over the 5 real tokens
        ("bnpo", 1.02 / 5),  # one micro-batch: the same
        ("grpo", (-2.78 / 3 + 3.8 / 2) / 2),  # mean of per-sequence means
        ("dr_grpo", 1.02 / (2 * 4)),  # constant: batch * max_completion_length
    ],
)
def test_clipped_loss_hand_computed(loss_type, expected):
    loss, stats, _ = run_loss(loss_type)
    close(loss, expected)
    close(stats["clip_ratio"], 2 / 5)  # row 0 token 0 (high clip, A>0), row 1 token 1 (low clip, A<0)


def test_clipped_tokens_have_no_gradient():
    loss, _, logps = run_loss("dapo")
    loss.backward()
    # d/dlogp of -A*r/5 where unclipped; 0 where clipped or masked
    close(logps.grad, [[0.0, -0.5 / 5, -1.0 / 5], [2.0 * 1.1 / 5, 0.0, 0.0]])


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo"])
def test_micro_batches_sum_to_the_full_batch(loss_type):
    full, _, _ = run_loss(loss_type)
    norm = LossNorm.from_mask(MASK, micro_batch_size=1)
    parts = sum(run_loss(loss_type, slice(i, i + 1), norm)[0] for i in range(2))
    if loss_type == "bnpo":  # per-micro-batch token means, averaged (as TRL's bnpo)
        close(parts, (-2.78 / 3 + 3.8 / 2) / 2)
    else:
        close(parts, full.item())


def test_ratio_one_when_old_logps_missing():
    logps = torch.log(RATIOS).requires_grad_(True)
    loss, stats = policy_loss(logps, ADV, MASK, SAPOLossConfig(), LossNorm(2, 5))
    close(loss, (-1.0 * 3 + 2.0 * 2) / 5)  # every ratio is 1: -A per token
    close(stats["clip_ratio"], 0.0)


def test_kl_k3_and_beta():
    close(kl_k3(torch.zeros(2), torch.log(torch.tensor([2.0, 0.5]))), [2 - math.log(2) - 1, 0.5 + math.log(2) - 1])
    logps = torch.zeros(2, 3)
    ref = torch.full((2, 3), math.log(2.0))
    cfg = SAPOLossConfig(beta=0.1)
    loss, stats = policy_loss(logps, torch.zeros(2), MASK, cfg, LossNorm(2, 5), ref_logps=ref)
    close(loss, 0.1 * (1 - math.log(2)))  # zero advantage: only the KL term, token-mean
    close(stats["kl"], 1 - math.log(2))
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(logps, torch.zeros(2), MASK, cfg, LossNorm(2, 5))
