"""One completion length: dr_grpo's normaliser is the generation cap, as in TRL."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from decentrain.algorithms.sapo.config import NodeOverride, SAPOConfig
from decentrain.algorithms.sapo.generation import SamplingConfig
from decentrain.algorithms.sapo.grpo import LossNorm, SAPOLossConfig, policy_loss
from decentrain.config import register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"


def trl_dr_grpo(per_token_loss: torch.Tensor, mask: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """TRL's GRPOTrainer, loss_type="dr_grpo": one `max_completion_length` caps generation and normalises."""
    return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)


def test_dr_grpo_loss_has_trls_scale_for_the_generation_cap():
    cfg = SAPOConfig(sampling=SamplingConfig(max_new_tokens=16), loss=SAPOLossConfig(loss_type="dr_grpo"))
    assert cfg.loss.max_completion_length == 16
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -2.0])
    loss, _ = policy_loss(logps, adv, mask, cfg.loss, LossNorm.from_mask(mask, 2))  # ratio 1: -A per token
    # hand: tokens give -1·3 + 2·2 = 1, over 2 completions × 16 tokens
    assert loss.item() == pytest.approx(1 / 32)
    assert loss.item() == pytest.approx(trl_dr_grpo(-adv[:, None].expand(2, 3), mask, 16).item())


def test_a_different_completion_length_is_refused_at_config_time():
    with pytest.raises(ValueError, match=r"loss.max_completion_length=64 must equal sampling.max_new_tokens=16"):
        SAPOConfig(sampling=SamplingConfig(max_new_tokens=16), loss=SAPOLossConfig(max_completion_length=64))
    SAPOConfig(sampling=SamplingConfig(max_new_tokens=16), loss=SAPOLossConfig(max_completion_length=16))
    with pytest.raises(ValueError, match="max_completion_length=0"):
        SAPOLossConfig(max_completion_length=0)


def test_a_node_with_its_own_generation_cap_normalises_by_it():
    cfg = SAPOConfig(
        sampling=SamplingConfig(max_new_tokens=16),
        nodes=[NodeOverride(), NodeOverride(sampling={"max_new_tokens": 32})],
    )
    assert cfg.for_node(0).loss.max_completion_length == 16
    assert cfg.for_node(1).loss.max_completion_length == 32


def test_the_rl_recipe_config_has_one_completion_length():
    register_configs("sapo")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        dcfg = compose("rl", overrides=["run_dir=/tmp/x", "loss.loss_type=dr_grpo"])
    cfg = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(SAPOConfig), OmegaConf.to_container(dcfg, resolve=True))
    )
    assert cfg.loss.max_completion_length == cfg.sampling.max_new_tokens == 16


def test_dr_grpo_without_a_length_refuses_rather_than_guessing():
    with pytest.raises(ValueError, match="dr_grpo"):
        policy_loss(
            torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), SAPOLossConfig(loss_type="dr_grpo"), LossNorm(1, 2)
        )
