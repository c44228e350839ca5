"""Ensemble weightings for HDEE: mix K experts' per-token log-probs in log space.

Every weighting takes `token_logp` of shape [K, B, T], where
`token_logp[j, b, t] = log p_j(x_t | x_<t)` is expert j's log-prob of the target
token, and returns the ensemble's log p(x_t | x_<t) of shape [B, T].

The posterior weightings follow HDEE (arXiv 2502.19385) / Branch-Train-Merge:

    w_{j,t}    = softmax_j( log pi_j + sum_{s<t} log p_j(x_s | x_<s) )
    log p(x_t) = logsumexp_j( log w_{j,t} + log p_j(x_t | x_<t) )

so the first token of a sequence is weighted by the prior alone. Inputs are packed
blocks (no padding): every position of a row belongs to the same sequence.

Registered names (`MixingConfig.name`):
  uniform  posterior weights with a uniform prior pi_j = 1/K
  cached   posterior weights with a prior fit by `CachedPrior` on the validation split
  topk     posterior weights (cached prior if given, else uniform), keep the `top_k`
           largest per token, renormalise
  average  plain arithmetic probability average, log mean_j p_j(x_t | x_<t)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from decentrain.core.registry import Registry

# The cached prior may only ever see held-out data that is not the evaluation data.
VALIDATION_SPLITS = ("val", "validation")


@dataclass
class MixingConfig:
    name: str = "uniform"  # one of WEIGHTINGS.names()
    top_k: int = 1  # experts kept per token by `topk`

    def __post_init__(self) -> None:
        WEIGHTINGS.get(self.name, field="mixing.name")
        if self.top_k < 1:
            raise ValueError(f"mixing.top_k={self.top_k} must be >= 1")


# (token_logp [K, B, T], log_prior [K] or None, cfg) -> mixed log-probs [B, T]
Weighting = Callable[[Tensor, Tensor | None, MixingConfig], Tensor]
WEIGHTINGS: Registry[Weighting] = Registry("weighting")


def _check_logp(token_logp: Tensor) -> None:
    if token_logp.dim() != 3:
        raise ValueError(f"token_logp must have shape [K, B, T], got {tuple(token_logp.shape)}")


def _log_prior(token_logp: Tensor, log_prior: Tensor | None) -> Tensor:
    k = token_logp.shape[0]
    if log_prior is None:
        return token_logp.new_full((k,), -math.log(k))
    if log_prior.shape != (k,):
        raise ValueError(f"log_prior must have shape [{k}] (one per expert), got {tuple(log_prior.shape)}")
    return log_prior.to(token_logp)


def log_posterior_weights(token_logp: Tensor, log_prior: Tensor | None = None) -> Tensor:
    """log w_{j,t} of shape [K, B, T]: the prior times the likelihood of the strict prefix."""
    _check_logp(token_logp)
    # Exclusive prefix sum: shift right by one so position t sees only s < t. In float64,
    # since sums reach -1e5 over long sequences and the weights hinge on their differences.
    prefix = torch.nn.functional.pad(token_logp[..., :-1].double(), (1, 0)).cumsum(dim=-1)
    logits = _log_prior(token_logp, log_prior).double()[:, None, None] + prefix
    return logits.log_softmax(dim=0).to(token_logp.dtype)


def mix_with_weights(token_logp: Tensor, log_w: Tensor) -> Tensor:
    """logsumexp_j(log w_{j,t} + log p_j(x_t)) -> [B, T]."""
    return torch.logsumexp(log_w + token_logp, dim=0)


def posterior_mix(token_logp: Tensor, log_prior: Tensor | None = None) -> Tensor:
    """Prefix-posterior ensemble; `log_prior=None` means uniform."""
    return mix_with_weights(token_logp, log_posterior_weights(token_logp, log_prior))


def topk_mix(token_logp: Tensor, k: int, log_prior: Tensor | None = None) -> Tensor:
    """Prefix-posterior ensemble restricted to the k heaviest experts per token."""
    if k < 1:
        raise ValueError(f"top_k={k} must be >= 1")
    log_w = log_posterior_weights(token_logp, log_prior)
    k = min(k, log_w.shape[0])
    # Stable sort breaks ties (e.g. the uniform prior at t=0) towards the lower expert
    # index, so every rank and device picks the same experts.
    order = log_w.sort(dim=0, descending=True, stable=True).indices
    keep = torch.zeros_like(log_w, dtype=torch.bool).scatter_(0, order[:k], True)
    log_w = log_w.masked_fill(~keep, -math.inf)
    log_w = log_w - torch.logsumexp(log_w, dim=0, keepdim=True)
    return mix_with_weights(token_logp, log_w)


def average_mix(token_logp: Tensor) -> Tensor:
    """log( (1/K) sum_j p_j(x_t) ): no weighting at all."""
    _check_logp(token_logp)
    return torch.logsumexp(token_logp, dim=0) - math.log(token_logp.shape[0])


@WEIGHTINGS.register("uniform")
def _uniform(token_logp: Tensor, log_prior: Tensor | None, cfg: MixingConfig) -> Tensor:
    if log_prior is not None:
        raise ValueError("weighting 'uniform' takes no log_prior; use mixing.name='cached' to apply one")
    return posterior_mix(token_logp)


@WEIGHTINGS.register("cached")
def _cached(token_logp: Tensor, log_prior: Tensor | None, cfg: MixingConfig) -> Tensor:
    if log_prior is None:
        raise ValueError("weighting 'cached' needs log_prior, from CachedPrior fit on the validation split")
    return posterior_mix(token_logp, log_prior)


@WEIGHTINGS.register("topk")
def _topk(token_logp: Tensor, log_prior: Tensor | None, cfg: MixingConfig) -> Tensor:
    return topk_mix(token_logp, cfg.top_k, log_prior)


@WEIGHTINGS.register("average")
def _average(token_logp: Tensor, log_prior: Tensor | None, cfg: MixingConfig) -> Tensor:
    if log_prior is not None:
        raise ValueError("weighting 'average' takes no log_prior; it weights experts equally")
    return average_mix(token_logp)


def mix(token_logp: Tensor, cfg: MixingConfig, log_prior: Tensor | None = None) -> Tensor:
    """Mix [K, B, T] expert log-probs into [B, T] with the weighting named by `cfg.name`."""
    return WEIGHTINGS.get(cfg.name, field="mixing.name")(token_logp, log_prior, cfg)


class CachedPrior:
    """EMA of per-sequence expert posteriors on the validation split.

    Each sequence's posterior is softmax_j(sum_t log p_j(x_t)), i.e. the prefix
    posterior after the whole sequence under a uniform prior. The estimate starts
    uniform and folds in sequences in order, prior <- (1 - alpha) * prior + alpha *
    posterior, until `max_sequences` have been seen. Starting uniform keeps every
    expert's prior strictly positive after 100 updates (>= 0.7**100 / K), so no
    expert is silenced for good by a log(0).
    """

    def __init__(self, num_experts: int, alpha: float = 0.3, max_sequences: int = 100):
        if num_experts < 1:
            raise ValueError(f"num_experts={num_experts} must be >= 1")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must be in (0, 1]")
        if max_sequences < 1:
            raise ValueError(f"max_sequences={max_sequences} must be >= 1")
        self.alpha = alpha
        self.max_sequences = max_sequences
        self.num_sequences = 0
        # float64: the EMA runs over many tiny posteriors; keep them from rounding to 0.
        self._prior = torch.full((num_experts,), 1.0 / num_experts, dtype=torch.float64)

    @property
    def full(self) -> bool:
        return self.num_sequences >= self.max_sequences

    def update(self, token_logp: Tensor, *, split: str) -> int:
        """Fold in the rows of a [K, B, T] batch from `split`; returns rows used."""
        if split not in VALIDATION_SPLITS:
            raise ValueError(
                f"CachedPrior fits on the validation split only (split in {VALIDATION_SPLITS}), "
                f"got split={split!r}; fitting on the test split would leak it into evaluation"
            )
        _check_logp(token_logp)
        if token_logp.shape[0] != self._prior.numel():
            raise ValueError(f"token_logp has {token_logp.shape[0]} experts, the prior has {self._prior.numel()}")
        take = min(token_logp.shape[1], self.max_sequences - self.num_sequences)
        posteriors = token_logp[:, :take].double().sum(dim=-1).softmax(dim=0)  # [K, take]
        for b in range(take):
            self._prior = (1.0 - self.alpha) * self._prior + self.alpha * posteriors[:, b]
        self.num_sequences += take
        return take

    def log_prior(self) -> Tensor:
        """log pi_j of shape [K] (float32), ready for `mix(..., log_prior=...)`."""
        if self.num_sequences == 0:
            raise ValueError("CachedPrior has seen no validation sequences; call update() first")
        return self._prior.log().float()
