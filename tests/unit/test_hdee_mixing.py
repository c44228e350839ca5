"""HDEE weightings against hand-computed mixtures on tiny tensors (K experts, B=1, T=3)."""

import math

import pytest
import torch

from decentrain.algorithms.hdee.mixing import (
    WEIGHTINGS,
    CachedPrior,
    MixingConfig,
    average_mix,
    log_posterior_weights,
    mix,
    posterior_mix,
    topk_mix,
)


def logp(*probs_per_expert: list[float]) -> torch.Tensor:
    """[K, 1, T] log-probs from per-expert target probabilities."""
    return torch.tensor(probs_per_expert, dtype=torch.float64).log()[:, None, :]


def close(got: torch.Tensor, want_probs: list[float]) -> None:
    torch.testing.assert_close(got, torch.tensor([want_probs], dtype=torch.float64).log())


# Two experts: p0 = (1/2, 1/4, 1/2), p1 = (1/4, 1/2, 1/8).
TWO = ([0.5, 0.25, 0.5], [0.25, 0.5, 0.125])


def test_uniform_prior_posterior_by_hand():
    # t0: prior only, (.5 + .25) / 2.  t1: w ∝ (.5, .25) = (2/3, 1/3).  t2: w ∝ (1/8, 1/8).
    want = [0.375, 2 / 3 * 0.25 + 1 / 3 * 0.5, 0.5 * 0.5 + 0.5 * 0.125]
    close(posterior_mix(logp(*TWO)), want)
    close(mix(logp(*TWO), MixingConfig("uniform")), want)


def test_cached_prior_posterior_by_hand():
    prior = torch.tensor([0.2, 0.8]).log()
    # t0: .2*.5 + .8*.25.  t1: w ∝ (.1, .2).  t2: w ∝ (.025, .1) = (.2, .8).
    want = [0.3, 1 / 3 * 0.25 + 2 / 3 * 0.5, 0.2 * 0.5 + 0.8 * 0.125]
    close(mix(logp(*TWO), MixingConfig("cached"), log_prior=prior), want)


def test_first_token_weights_are_the_prior():
    prior = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    token_logp = torch.randn(3, 2, 4, dtype=torch.float64)
    log_w = log_posterior_weights(token_logp, prior.log())
    torch.testing.assert_close(log_w[:, :, 0].exp(), prior[:, None].expand(3, 2))
    # and a later token's weight ignores that token's own log-prob
    bumped = token_logp.clone()
    bumped[:, :, 2] += torch.tensor([5.0, -5.0, 0.0], dtype=torch.float64)[:, None]
    torch.testing.assert_close(log_posterior_weights(bumped, prior.log())[..., :3], log_w[..., :3])


# Three experts for top-k and the average.
THREE = ([0.1, 0.5, 0.2], [0.4, 0.2, 0.5], [0.8, 0.8, 0.1])
THREE_PRIOR = torch.tensor([0.5, 0.3, 0.2]).log()


def test_topk_renormalised_by_hand():
    # t0: w = prior, keep experts 0, 1: (.5 * .1 + .3 * .4) / .8
    # t1: w ∝ (.05, .12, .16), keep 2, 1.  t2: w ∝ (.025, .024, .128), keep 2, 0.
    want = [
        (0.5 * 0.1 + 0.3 * 0.4) / 0.8,
        (0.16 * 0.8 + 0.12 * 0.2) / 0.28,
        (0.128 * 0.1 + 0.025 * 0.2) / 0.153,
    ]
    close(topk_mix(logp(*THREE), 2, THREE_PRIOR), want)
    close(mix(logp(*THREE), MixingConfig("topk", top_k=2), log_prior=THREE_PRIOR), want)


def test_topk_edge_cases():
    x = logp(*THREE)
    torch.testing.assert_close(topk_mix(x, 3), posterior_mix(x))
    torch.testing.assert_close(topk_mix(x, 10), posterior_mix(x))
    # top-1 with a uniform prior: t0 is a three-way tie, broken towards expert 0.
    # t1: w ∝ (.1, .4, .8) -> expert 2.  t2: w ∝ (.05, .08, .64) -> expert 2.
    close(topk_mix(x, 1), [0.1, 0.8, 0.1])


def test_average_by_hand():
    want = [sum(p[t] for p in THREE) / 3 for t in range(3)]
    close(average_mix(logp(*THREE)), want)
    close(mix(logp(*THREE), MixingConfig("average")), want)


@pytest.mark.parametrize("name", ["uniform", "topk", "average"])
def test_identical_experts_mix_to_themselves(name):
    one = torch.randn(1, 2, 5).log_softmax(-1)
    torch.testing.assert_close(mix(one.expand(3, 2, 5), MixingConfig(name, top_k=2)), one[0])


@pytest.mark.parametrize("name", ["uniform", "cached", "topk", "average"])
def test_stable_for_long_unlikely_sequences(name):
    # Prefix sums reach -1e5: probability space would underflow to 0/0.
    token_logp = -50.0 - 10.0 * torch.rand(3, 2, 2000)
    prior = torch.tensor([0.2, 0.3, 0.5]).log() if name == "cached" else None
    out = mix(token_logp, MixingConfig(name, top_k=2), log_prior=prior)
    assert out.shape == (2, 2000) and torch.isfinite(out).all()
    # a mixture never beats its best expert nor loses to its worst
    assert (out <= token_logp.max(0).values + 1e-4).all() and (out >= token_logp.min(0).values - 1e-4).all()


def test_registry_and_config_errors():
    assert WEIGHTINGS.names() == ["average", "cached", "topk", "uniform"]
    with pytest.raises(ValueError, match=r"mixing.name='posterior' is unknown; allowed: \['average'"):
        MixingConfig("posterior")
    with pytest.raises(ValueError, match="mixing.top_k=0"):
        MixingConfig("topk", top_k=0)
    with pytest.raises(ValueError, match="'cached' needs log_prior"):
        mix(logp(*TWO), MixingConfig("cached"))
    with pytest.raises(ValueError, match="'uniform' takes no log_prior"):
        mix(logp(*TWO), MixingConfig("uniform"), log_prior=torch.zeros(2))
    with pytest.raises(ValueError, match=r"log_prior must have shape \[2\]"):
        posterior_mix(logp(*TWO), torch.zeros(3))
    with pytest.raises(ValueError, match=r"\[K, B, T\]"):
        posterior_mix(torch.zeros(2, 3))


def test_cached_prior_ema_by_hand():
    prior = CachedPrior(num_experts=2, alpha=0.3)
    # Sequence 1: products 1/16 vs 1/64 -> posterior (.8, .2).  Sequence 2: 1/32 vs 1/32 -> (.5, .5).
    seq1 = logp(*TWO)
    seq2 = logp([0.5, 0.25, 0.25], [0.25, 0.25, 0.5])
    assert prior.update(torch.cat([seq1, seq2], dim=1), split="val") == 2
    first = [0.7 * 0.5 + 0.3 * 0.8, 0.7 * 0.5 + 0.3 * 0.2]  # (.59, .41), from a uniform start
    want = [0.7 * first[0] + 0.3 * 0.5, 0.7 * first[1] + 0.3 * 0.5]
    torch.testing.assert_close(prior.log_prior().exp(), torch.tensor(want))
    # and it plugs straight into the cached weighting
    mixed = mix(seq1, MixingConfig("cached"), log_prior=prior.log_prior())
    assert torch.isfinite(mixed).all()


def test_cached_prior_stops_after_max_sequences():
    prior = CachedPrior(num_experts=3, max_sequences=3)
    batch = torch.randn(3, 2, 4)
    assert prior.update(batch, split="validation") == 2
    assert prior.update(batch, split="validation") == 1
    assert prior.full and prior.num_sequences == 3
    before = prior.log_prior()
    assert prior.update(batch, split="val") == 0
    torch.testing.assert_close(prior.log_prior(), before)


def test_cached_prior_default_keeps_every_expert_alive():
    # 100 sequences that all favour expert 0 overwhelmingly.
    prior = CachedPrior(num_experts=2)
    seq = torch.stack([torch.zeros(100, 8), torch.full((100, 8), -100.0)])
    prior.update(seq, split="val")
    assert prior.num_sequences == 100
    log_prior = prior.log_prior()
    assert torch.isfinite(log_prior).all() and math.isclose(log_prior.exp().sum().item(), 1.0, rel_tol=1e-6)


@pytest.mark.parametrize("split", ["test", "train", "Test"])
def test_cached_prior_refuses_other_splits(split):
    prior = CachedPrior(num_experts=2)
    with pytest.raises(ValueError, match=f"split={split!r}"):
        prior.update(logp(*TWO), split=split)
    assert prior.num_sequences == 0
    with pytest.raises(ValueError, match="no validation sequences"):
        prior.log_prior()


def test_cached_prior_argument_errors():
    with pytest.raises(ValueError, match="alpha=0"):
        CachedPrior(2, alpha=0.0)
    with pytest.raises(ValueError, match="num_experts=0"):
        CachedPrior(0)
    with pytest.raises(ValueError, match="3 experts"):
        CachedPrior(2).update(torch.zeros(3, 1, 2), split="val")
