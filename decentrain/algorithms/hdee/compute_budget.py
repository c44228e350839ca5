"""Compute budget of an HDEE plan: C = sum_j 6 * N_j * D_j.

N_j counts non-embedding parameters (Kaplan et al.): the embedding lookup and the
output head are excluded, so widths compare by the FLOPs of the transformer blocks.
D_j is the number of tokens expert j trains on. A heterogeneous plan is only a fair
comparison if it spends what its homogeneous baseline spends, within a tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn
from transformers import PretrainedConfig

from decentrain.algorithms.hdee.plan import EnsemblePlan, LaneConfig, SeedConfig
from decentrain.core.config_checks import check_range

# model_type -> (q/k/v bias, o bias); None reads config.attention_bias.
_ATTENTION_BIAS: dict[str, tuple[bool | None, bool | None]] = {
    "llama": (None, None),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (None, None),
}


def non_embedding_params(config: PretrainedConfig, intermediate_size: int | None = None) -> int:
    """Analytic non-embedding parameter count of a decoder-only HF config.

    `intermediate_size` overrides the config's FFN width (HDEE varies only that).
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in _ATTENTION_BIAS:
        raise ValueError(f"model_type={model_type!r} is not supported; allowed: {sorted(_ATTENTION_BIAS)}")
    qkv_bias, o_bias = (
        bool(getattr(config, "attention_bias", False)) if b is None else b for b in _ATTENTION_BIAS[model_type]
    )
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads  # GQA
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    ffn = config.intermediate_size if intermediate_size is None else intermediate_size
    mlp_bias = bool(getattr(config, "mlp_bias", False))

    q = hidden * heads * head_dim + qkv_bias * heads * head_dim
    kv = 2 * (hidden * kv_heads * head_dim + qkv_bias * kv_heads * head_dim)
    o = heads * head_dim * hidden + o_bias * hidden
    qk_norm = 2 * head_dim if model_type == "qwen3" else 0
    mlp = 3 * hidden * ffn + mlp_bias * (2 * ffn + hidden)  # gate, up, down
    norms = 2 * hidden  # input and post-attention RMSNorm
    per_layer = q + kv + o + qk_norm + mlp + norms
    return config.num_hidden_layers * per_layer + hidden  # + final norm


def count_non_embedding_params(model: nn.Module) -> int:
    """Counted on an instantiated HF model: all parameters minus input and output embeddings."""
    skip = {id(p) for p in model.get_input_embeddings().parameters()}
    head = model.get_output_embeddings()
    if head is not None:
        skip |= {id(p) for p in head.parameters()}
    # parameters() yields tied weights once.
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def train_flops(params: int, tokens: int) -> int:
    return 6 * params * tokens


@dataclass(frozen=True)
class RunCost:
    name: str
    params: int  # non-embedding
    tokens: int

    @property
    def flops(self) -> int:
        return train_flops(self.params, self.tokens)

    def __str__(self) -> str:
        return f"{self.name}: N={self.params:,} D={self.tokens:,} C={self.flops:.3e}"


def plan_costs(plan: EnsemblePlan, config: PretrainedConfig, include_seeds: bool = True) -> list[RunCost]:
    """One cost per seed (if included) and per expert lane, summed over its domains."""
    costs = []
    if include_seeds:
        for seed in plan.seeds:
            n = non_embedding_params(config, seed.intermediate_size)
            costs.append(RunCost(f"seed {seed.name}", n, seed.steps * plan.tokens_per_step))
    for i, lane in enumerate(plan.lanes):
        n = non_embedding_params(config, lane.intermediate_size)
        costs.append(RunCost(f"lane{i} ({lane.size})", n, sum(lane.steps) * plan.tokens_per_step))
    return costs


def plan_flops(plan: EnsemblePlan, config: PretrainedConfig, include_seeds: bool = True) -> int:
    return sum(c.flops for c in plan_costs(plan, config, include_seeds))


def check_budget(
    plan: EnsemblePlan,
    baseline: EnsemblePlan,
    config: PretrainedConfig,
    tolerance: float = 0.05,
    include_seeds: bool = True,
) -> float:
    """Refuse `plan` if its compute is off the baseline's by more than `tolerance`.

    Returns the relative difference (plan - baseline) / baseline.
    """
    check_range("tolerance", tolerance, 0, None)
    ours = plan_costs(plan, config, include_seeds)
    theirs = plan_costs(baseline, config, include_seeds)
    c_plan, c_base = sum(c.flops for c in ours), sum(c.flops for c in theirs)
    rel = (c_plan - c_base) / c_base
    if not abs(rel) <= tolerance:  # written so that a NaN anywhere refuses
        lines = [
            f"plan compute {c_plan:.4e} FLOPs is {rel:+.2%} off the homogeneous baseline's "
            f"{c_base:.4e} FLOPs (tolerance {tolerance:.1%})",
            "  plan:     " + "; ".join(map(str, ours)),
            "  baseline: " + "; ".join(map(str, theirs)),
        ]
        raise ValueError("\n".join(lines))
    return rel


def homogeneous_baseline(plan: EnsemblePlan, seed: SeedConfig, steps_per_domain: int) -> EnsemblePlan:
    """The same lanes and domains, every expert at `seed`'s width and equal steps."""
    lanes = [
        LaneConfig(
            domains=list(lane.domains),
            steps=[steps_per_domain] * len(lane.domains),
            size=seed.size,
            intermediate_size=seed.intermediate_size,
            seed=seed.name,
            tokenizer=seed.tokenizer,
        )
        for lane in plan.lanes
    ]
    return EnsemblePlan(seeds=[seed], lanes=lanes, tokens_per_step=plan.tokens_per_step)


def solve_steps(
    config: PretrainedConfig,
    intermediate_sizes: Sequence[int],
    num_domains: Sequence[int],
    target_flops: int,
    tokens_per_step: int,
    shares: Sequence[float] | None = None,
) -> list[int]:
    """Steps per domain for each expert so the experts together spend `target_flops`.

    Expert j gets the fraction shares[j] (normalised; equal by default) of the
    target, e.g. shares 3/4/5 for the paper's 300/400/500-step lanes. Rounding to
    whole steps costs at most half a step per domain per expert.
    """
    k = len(intermediate_sizes)
    shares = [1.0] * k if shares is None else list(shares)
    if len(num_domains) != k or len(shares) != k:
        raise ValueError(
            f"intermediate_sizes, num_domains and shares need one entry per expert; "
            f"got {k}, {len(num_domains)}, {len(shares)}"
        )
    if any(s <= 0 for s in shares):
        raise ValueError(f"shares={shares} must all be > 0")
    if target_flops <= 0 or tokens_per_step <= 0:
        raise ValueError(f"target_flops={target_flops} and tokens_per_step={tokens_per_step} must be > 0")
    total = sum(shares)
    steps = []
    for j, (width, n_dom, share) in enumerate(zip(intermediate_sizes, num_domains, shares)):
        per_step = train_flops(non_embedding_params(config, width), tokens_per_step) * n_dom
        s = round(target_flops * share / total / per_step)
        if s < 1:
            raise ValueError(
                f"expert {j} (intermediate_size={width}) gets {target_flops * share / total:.3e} FLOPs, "
                f"less than one step on each of its {n_dom} domains ({per_step:.3e} FLOPs)"
            )
        steps.append(s)
    return steps
