"""HDEE compute budget: non-embedding N, C = sum 6 N D, and refusing unmatched plans."""

import re

import pytest
from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from decentrain.algorithms.hdee.compute_budget import (
    check_budget,
    count_non_embedding_params,
    homogeneous_baseline,
    non_embedding_params,
    plan_costs,
    plan_flops,
    solve_steps,
)
from decentrain.algorithms.hdee.plan import EnsemblePlan, LaneConfig, SeedConfig

TINY = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def llama(**kw) -> LlamaConfig:
    return LlamaConfig(**{**TINY, "intermediate_size": 48, **kw})


@pytest.mark.parametrize(
    "config",
    [llama(), llama(attention_bias=True, mlp_bias=True, tie_word_embeddings=True), llama(head_dim=16)],
    ids=["gqa", "biases-tied", "head_dim"],
)
def test_analytic_matches_counted_llama(config):
    assert non_embedding_params(config) == count_non_embedding_params(LlamaForCausalLM(config))


def test_analytic_matches_counted_qwen2_and_width_override():
    config = Qwen2Config(**TINY, intermediate_size=40)  # q/k/v carry a bias, o does not
    assert non_embedding_params(config) == count_non_embedding_params(Qwen2ForCausalLM(config))
    wide = llama(intermediate_size=80)
    assert non_embedding_params(llama(), intermediate_size=80) == count_non_embedding_params(LlamaForCausalLM(wide))


def test_by_hand_and_unsupported():
    # per layer: q 32*32, k/v 2*32*16, o 32*32, mlp 3*32*48, norms 2*32; plus the final norm
    per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 48 + 2 * 32
    assert non_embedding_params(llama()) == 2 * per_layer + 32
    with pytest.raises(ValueError, match=r"model_type='gpt2' is not supported; allowed: \['llama'"):
        non_embedding_params(GPT2Config())


def make_plan(widths, steps, tokens_per_step=1024, domains=2) -> EnsemblePlan:
    seeds = [SeedConfig(name=f"seed{w}", size=f"w{w}", intermediate_size=w, steps=10) for w in sorted(set(widths))]
    lanes = [
        LaneConfig(["python"] * domains, [s] * domains, size=f"w{w}", intermediate_size=w, seed=f"seed{w}")
        for w, s in zip(widths, steps)
    ]
    return EnsemblePlan(seeds=seeds, lanes=lanes, tokens_per_step=tokens_per_step)


def test_plan_flops_is_six_n_d():
    config = llama()
    p = make_plan([48, 80], [3, 5])
    n48, n80 = non_embedding_params(config, 48), non_embedding_params(config, 80)
    lanes_c = 6 * n48 * (2 * 3 * 1024) + 6 * n80 * (2 * 5 * 1024)
    seeds_c = 6 * (n48 + n80) * 10 * 1024
    assert plan_flops(p, config, include_seeds=False) == lanes_c
    assert plan_flops(p, config) == lanes_c + seeds_c
    assert [c.name for c in plan_costs(p, config)] == ["seed seed48", "seed seed80", "lane0 (w48)", "lane1 (w80)"]


def test_heterogeneous_steps_match_baseline():
    config = llama()
    base = make_plan([48] * 3, [400] * 3)
    assert check_budget(make_plan([48] * 3, [300, 400, 500]), base, config) == 0.0
    assert homogeneous_baseline(make_plan([48] * 3, [300, 400, 500]), base.seeds[0], 400) == base


def test_over_budget_plan_is_refused_with_numbers():
    config = llama()
    base = make_plan([48] * 3, [400] * 3)
    over = make_plan([48] * 3, [400, 400, 600])
    c_over, c_base = plan_flops(over, config), plan_flops(base, config)
    rel = (c_over - c_base) / c_base
    with pytest.raises(ValueError) as err:
        check_budget(over, base, config, tolerance=0.05)
    msg = str(err.value)
    assert f"{c_over:.4e}" in msg and f"{c_base:.4e}" in msg and f"{rel:+.2%}" in msg and "tolerance 5.0%" in msg
    assert re.search(r"lane2 \(w48\): N=[\d,]+ D=1,228,800", msg)  # 2 domains x 600 steps x 1024 tokens
    # within a wider tolerance it passes, and the relative gap comes back
    assert check_budget(over, base, config, tolerance=0.2) == pytest.approx(rel)
    with pytest.raises(ValueError, match=r"plan compute .* is -\d"):
        check_budget(make_plan([48] * 3, [300] * 3), base, config)
    with pytest.raises(ValueError, match="tolerance=-0.1"):
        check_budget(base, base, config, tolerance=-0.1)


def test_solved_sizes_match_baseline():
    config = llama()
    base = make_plan([48] * 3, [400] * 3)
    target = plan_flops(base, config, include_seeds=False)
    widths = [32, 48, 64]  # S / M / L at fixed depth
    steps = solve_steps(config, widths, [2, 2, 2], target, tokens_per_step=1024)
    assert steps[0] > 400 > steps[2]  # smaller experts train longer
    het = make_plan(widths, steps)
    assert abs(check_budget(het, base, config, include_seeds=False)) < 0.01
    # shares split the budget unevenly, e.g. 3:4:5 at one width reproduces 300/400/500
    assert solve_steps(config, [48] * 3, [2] * 3, target, 1024, shares=[3, 4, 5]) == [300, 400, 500]


def test_solve_steps_errors():
    config = llama()
    with pytest.raises(ValueError, match="one entry per expert; got 2, 3, 2"):
        solve_steps(config, [32, 48], [1, 1, 1], 10**12, 1024)
    with pytest.raises(ValueError, match=r"expert 0 \(intermediate_size=32\) gets .* less than one step"):
        solve_steps(config, [32], [1], 10, 1024)
