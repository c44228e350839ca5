"""GRPO-family loss and the advantage estimators SAPO trains with (`group` and `spo`).

Option names follow TRL's `GRPOConfig` so that a TRL user reads the config as-is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from decentrain.core.registry import Registry

# "dapo" is TRL's current default: token-mean over every completion token of the whole
# (accumulated) batch, i.e. the "token-mean" SAPO's paper uses. "bnpo" is the same mean per
# micro-batch, "grpo" averages each sequence first, "dr_grpo" divides by a constant.
LOSS_TYPES = ("dapo", "bnpo", "grpo", "dr_grpo")
SCALE_REWARDS = ("group", "batch", "none")
SPO_DISCOUNTS = ("round", "observation")
SPO_INITS = ("group", "prior")
_STD_EPS = 1e-4  # TRL's epsilon in (r - mean) / (std + eps)


@dataclass
class SAPOLossConfig:
    num_generations: int = 8
    epsilon: float = 0.2  # lower clip: ratio >= 1 - epsilon
    epsilon_high: float = 0.28  # upper clip: ratio <= 1 + epsilon_high
    beta: float = 0.0  # KL(pi || ref) weight, k3 estimator; 0 needs no reference model
    loss_type: str = "dapo"
    scale_rewards: str | bool = "group"  # True == "group", False == "none", as in TRL
    num_iterations: int = 1  # optimizer passes per generated batch; >1 makes the clip active
    # dr_grpo's normaliser. TRL uses one value for it and the generation cap; here SAPOConfig sets it
    # from sampling.max_new_tokens when None and refuses a different value.
    max_completion_length: int | None = None
    advantage: str = "group"  # "group" (GRPO) or "spo" (per-prompt Beta value tracker)
    spo_rho: float = 0.875  # SPO tracker discount
    spo_discount: str = "round"  # "round": rho once per round; "observation": once per completion (SPO's update)
    spo_init: str = "group"  # unseen prompt's baseline: "group" (its own group mean) or "prior" (SPO's v = 0.5)
    # Off-policy correction of peers' groups (`truncated_is_weight`): senders attach their sampling
    # log-probs; where the tokenizer is the same, a peer's tokens are weighted min(pi/mu, cap).
    external_is: bool = False
    external_is_cap: float = 2.0
    # F-TIS (`filter_off_policy_negatives`): beside the TIS weights, a peer's completion with a negative
    # advantage is dropped when its per-token KL(sender || this node) exceeds this. None: off. Needs external_is.
    ftis_kl: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.scale_rewards, bool):
            self.scale_rewards = "group" if self.scale_rewards else "none"
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards={self.scale_rewards!r} is unknown; allowed: {list(SCALE_REWARDS)}")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r} is unknown; allowed: {list(LOSS_TYPES)}")
        ADVANTAGE_ESTIMATORS.get(self.advantage, field="advantage")
        if self.num_generations < 2:
            raise ValueError(f"num_generations={self.num_generations} must be >= 2 (a group needs a baseline)")
        for name in ("epsilon", "epsilon_high", "beta"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations={self.num_iterations} must be >= 1")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(
                f"max_completion_length={self.max_completion_length} must be >= 1 (or null: sampling.max_new_tokens)"
            )
        if not 0.0 < self.spo_rho <= 1.0:
            raise ValueError(f"spo_rho={self.spo_rho} must be in (0, 1]")
        if self.spo_discount not in SPO_DISCOUNTS:
            raise ValueError(f"spo_discount={self.spo_discount!r} is unknown; allowed: {list(SPO_DISCOUNTS)}")
        if not (math.isfinite(self.external_is_cap) and self.external_is_cap >= 1):
            raise ValueError(f"external_is_cap={self.external_is_cap} must be finite and >= 1")
        if self.ftis_kl is not None and not (math.isfinite(self.ftis_kl) and self.ftis_kl > 0):
            raise ValueError(f"ftis_kl={self.ftis_kl} must be finite and > 0 (or null: off)")
        if self.ftis_kl is not None and not self.external_is:
            raise ValueError("ftis_kl needs external_is=true (senders attach their sampling log-probs only then)")
        if self.spo_init not in SPO_INITS:
            raise ValueError(f"spo_init={self.spo_init!r} is unknown; allowed: {list(SPO_INITS)}")


# ---------------------------------------------------------------------------------------------
# Advantages. Rewards come as [num_groups, G]; prompts name each group (the SPO tracker's key).


def group_advantages(rewards: Tensor, scale_rewards: str = "group") -> Tensor:
    """GRPO: r minus its group mean, divided by the group ("group") or batch ("batch") std."""
    advantages = rewards - rewards.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        advantages = advantages / (rewards.std(dim=1, keepdim=True) + _STD_EPS)
    elif scale_rewards == "batch":
        advantages = advantages / (rewards.std() + _STD_EPS)
    return advantages


class AdvantageEstimator(Protocol):
    def __call__(self, prompts: Sequence[str], rewards: Tensor) -> Tensor: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


ADVANTAGE_ESTIMATORS: Registry[type] = Registry("advantage")


@ADVANTAGE_ESTIMATORS.register("group")
class GroupAdvantage:
    def __init__(self, scale_rewards: str = "group"):
        self.scale_rewards = scale_rewards

    @classmethod
    def from_config(cls, cfg: SAPOLossConfig) -> GroupAdvantage:
        return cls(cfg.scale_rewards)

    def __call__(self, prompts: Sequence[str], rewards: Tensor) -> Tensor:
        return group_advantages(rewards, self.scale_rewards)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@ADVANTAGE_ESTIMATORS.register("spo")
class SPOTracker:
    """SPO's per-prompt Beta value tracker (arXiv 2509.13232), with a constant discount rho.

    v = a / (a + b); SPO's update for one observed reward r: a <- rho*a + r, b <- rho*b + (1 - r).
    SPO samples one completion per prompt and step; with G completions per round there are two
    readings, chosen by `discount`:
      "observation": SPO's update applied to each completion in turn (rho^G per round),
      "round":       the G completions come from one policy, so they are discounted once:
                     a <- rho*a + sum(r), b <- rho*b + sum(1 - r).
    Unseen prompts (`init`, a choice where SPO estimates v from n0 offline samples of the start
    policy): "group" starts from this round's own group (a = sum r, b = sum(1 - r), baseline =
    group mean); "prior" starts from SPO's n0 = 0 prior a = b = 0.5 (baseline 0.5), then updates.
    A = r - v (v from before this round's update), then z-scored over the whole batch, as SPO.
    The advantage uses the raw reward, as SPO; the tracker clamps it to [0, 1] (a choice: with a
    format bonus r can exceed 1, and b would then shrink, while the tracker models a success rate).
    """

    def __init__(self, rho: float = 0.875, discount: str = "round", init: str = "group"):
        if discount not in SPO_DISCOUNTS or init not in SPO_INITS:
            raise ValueError(f"discount={discount!r}, init={init!r}; allowed: {list(SPO_DISCOUNTS)}, {list(SPO_INITS)}")
        self.rho, self.discount, self.init = rho, discount, init
        self.alpha: dict[str, float] = {}
        self.beta: dict[str, float] = {}

    @classmethod
    def from_config(cls, cfg: SAPOLossConfig) -> SPOTracker:
        return cls(cfg.spo_rho, cfg.spo_discount, cfg.spo_init)

    def value(self, prompt: str) -> float | None:
        if prompt not in self.alpha:
            return None
        a, b = self.alpha[prompt], self.beta[prompt]
        return a / (a + b) if a + b > 0 else 0.5

    def update(self, prompt: str, rewards: Sequence[float]) -> None:
        r = np.clip(np.asarray(rewards, dtype=np.float64), 0.0, 1.0)
        if prompt not in self.alpha and self.init == "group":  # the group is its own first estimate
            self.alpha[prompt], self.beta[prompt] = float(r.sum()), float((1.0 - r).sum())
            return
        a, b = self.alpha.get(prompt, 0.5), self.beta.get(prompt, 0.5)
        if self.discount == "round":
            a, b = self.rho * a + float(r.sum()), self.rho * b + float((1.0 - r).sum())
        else:
            for x in r:
                a, b = self.rho * a + float(x), self.rho * b + float(1.0 - x)
        self.alpha[prompt], self.beta[prompt] = a, b

    def __call__(self, prompts: Sequence[str], rewards: Tensor) -> Tensor:
        baselines = []
        for prompt, r in zip(prompts, rewards.tolist(), strict=True):
            v = self.value(prompt)
            self.update(prompt, r)
            if v is None:  # unseen: the group's own mean ("group") or the prior's 0.5
                v = self.value(prompt) if self.init == "group" else 0.5
            baselines.append(v)
        advantages = rewards - torch.tensor(baselines, dtype=rewards.dtype, device=rewards.device)[:, None]
        return (advantages - advantages.mean()) / (advantages.std() + _STD_EPS)

    def sampling_weights(self, prompts: Sequence[str], eps: float = 0.05) -> np.ndarray:
        """SPO's prioritised sampling: p(x) ∝ sqrt(v(1-v)) + eps; unseen prompts count as v = 0.5."""
        v = np.array([0.5 if (x := self.value(p)) is None else x for p in prompts], dtype=np.float64)
        w = np.sqrt(v * (1.0 - v)) + eps
        return w / w.sum()

    def state_dict(self) -> dict[str, Any]:
        return {
            "rho": self.rho,
            "discount": self.discount,
            "init": self.init,
            "alpha": dict(self.alpha),
            "beta": dict(self.beta),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rho = float(state["rho"])
        self.alpha = {str(k): float(v) for k, v in state["alpha"].items()}
        self.beta = {str(k): float(v) for k, v in state["beta"].items()}


def build_advantage_estimator(cfg: SAPOLossConfig) -> AdvantageEstimator:
    return ADVANTAGE_ESTIMATORS.get(cfg.advantage, field="advantage").from_config(cfg)


# ---------------------------------------------------------------------------------------------
# Loss. All per-token tensors are [B, T] over completion tokens, with `mask` 1 on real tokens.


@dataclass(frozen=True)
class LossNorm:
    """Whole-batch counts, so that per-micro-batch losses sum to the full-batch loss."""

    num_sequences: int
    num_tokens: int
    num_micro_batches: int = 1

    @classmethod
    def from_mask(cls, completion_mask: Tensor, micro_batch_size: int) -> LossNorm:
        n = completion_mask.size(0)
        return cls(n, int(completion_mask.sum().item()), math.ceil(n / micro_batch_size))


def kl_k3(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(ref - pi) - (ref - pi) - 1 >= 0 (as TRL)."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1.0


def truncated_is_weight(old_logps: Tensor, sender_logps: Tensor, sender_mask: Tensor, cap: float) -> Tensor:
    """Per-token w = min(exp(log pi_old - log mu), cap), detached; 1 where `sender_mask` is 0.

    Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training"), as prime-rl's loss applies it (`tis_clip`:
    min(exp(trainer_logprobs - inference_logprobs), C), src/prime_rl/trainer/rl/loss.py), with
    mu the sender's sampling policy and pi_old this node's policy before the step: the clipped
    ratio pi/pi_old then covers the rest of pi/mu, as in TIS (w multiplies the PPO term). HACPO
    (arXiv 2603.02604) corrects shared rollouts too, with a sequence-level (GSPO) ratio, an
    exponent and stepwise clipping; the departure here is the per-token ratio, truncated above only.
    """
    log_ratio = torch.where(sender_mask.bool(), old_logps.detach() - sender_logps, torch.zeros_like(old_logps))
    return torch.clamp(torch.exp(log_ratio), max=cap).detach()


def filter_off_policy_negatives(
    old_logps: Tensor, sender_logps: Tensor, sender_mask: Tensor, advantages: Tensor, max_kl: float
) -> Tensor:
    """F-TIS's filter: [B] 1.0 for the completions kept, 0.0 for those dropped.

    A peer's completion (sender log-probs known, `sender_mask`) with a negative advantage is dropped
    when the mean over its tokens of the k3 estimate of KL(mu || pi_old), on tokens mu sampled,
    (r - 1) - log r with r = pi_old / mu, exceeds `max_kl`. Truncated IS bounds how much a token
    the sender liked far more than this node counts; a negative advantage on such a completion
    pushes down text this node would rarely write anyway, so F-TIS drops it outright. Positive
    completions are kept: they carry what the peer knows. This follows the filter as the issue
    describes Gensyn's 2026 follow-up to SAPO (the paper's text was not available here): the per-token
    mean and the k3 estimator are this code's choices. Own completions (mask 0) are always kept.
    """
    mask = sender_mask.to(old_logps.dtype)
    log_r = (old_logps.detach() - sender_logps) * mask
    kl = ((torch.exp(log_r) - 1.0 - log_r) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    drop = (advantages < 0) & (mask.sum(-1) > 0) & (kl > max_kl)
    return (~drop).to(advantages.dtype)


def policy_loss(
    logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: SAPOLossConfig,
    norm: LossNorm,
    old_logps: Tensor | None = None,
    ref_logps: Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-ratio loss of one micro-batch; `advantages` is [B], one per completion.

    `old_logps=None` means the batch was generated by this very policy (ratio 1, as TRL does
    for num_iterations == 1). `is_weights` ([B, T], detached; `truncated_is_weight`) multiply
    the policy-gradient term of peers' tokens, not the KL term.
    """
    mask = mask.to(logps.dtype)
    old_logps = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(logps - old_logps)
    adv = advantages[:, None]
    clipped = torch.clamp(ratio, 1.0 - cfg.epsilon, 1.0 + cfg.epsilon_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if is_weights is not None:
        per_token = per_token * is_weights

    stats: dict[str, Tensor] = {}
    if cfg.beta > 0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps from a reference model")
        kl = kl_k3(logps, ref_logps)
        per_token = per_token + cfg.beta * kl
        stats["kl"] = ((kl * mask).sum() / mask.sum().clamp(min=1)).detach()

    masked_sum = (per_token * mask).sum()
    if cfg.loss_type == "dapo":
        loss = masked_sum / max(norm.num_tokens, 1)
    elif cfg.loss_type == "bnpo":
        loss = masked_sum / mask.sum().clamp(min=1) / norm.num_micro_batches
    elif cfg.loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / norm.num_sequences
    else:  # dr_grpo
        if cfg.max_completion_length is None:
            raise ValueError(
                "loss_type='dr_grpo' needs max_completion_length (SAPOConfig sets it to sampling.max_new_tokens)"
            )
        loss = masked_sum / (norm.num_sequences * cfg.max_completion_length)

    is_clipped = ((ratio < 1 - cfg.epsilon) & (adv < 0)) | ((ratio > 1 + cfg.epsilon_high) & (adv > 0))
    stats["clip_ratio"] = ((is_clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)).detach()
    return loss, stats
