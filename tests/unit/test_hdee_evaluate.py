"""HDEE evaluation: the ensemble's perplexity by hand, bad ensembles refused before any work."""

import math

import pytest
import torch
from transformers import ByT5Tokenizer

from decentrain.algorithms.hdee import evaluate as ev
from decentrain.algorithms.hdee.evaluate import EnsembleScorer, check_saved_plan, expert_refs
from decentrain.algorithms.hdee.mixing import CachedPrior
from decentrain.core.comm.ensemble import token_logprobs
from decentrain.core.world import World
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import build_model
from decentrain.testing import save_random_experts, tiny_hdee_config


def test_missing_expert_is_named_before_any_work(tmp_path, monkeypatch):
    cfg = tiny_hdee_config(tmp_path)
    save_random_experts(cfg)
    missing = cfg.plan.final_experts()[1]
    (tmp_path / missing / "model" / "config.json").unlink()
    monkeypatch.setattr(ev, "build_model", lambda *a, **k: pytest.fail("loaded a model before checking"))
    with pytest.raises(FileNotFoundError, match=rf"expert {missing} \(lanes\[1\]\).*job.index=1"):
        EnsembleScorer(cfg, World())


def test_experts_with_different_tokenizers_are_refused_unless_opted_in(tmp_path):
    cfg = tiny_hdee_config(tmp_path)
    save_random_experts(cfg)
    odd = cfg.plan.final_experts()[2]
    ByT5Tokenizer(extra_ids=0).save_pretrained(tmp_path / odd / "model")  # a different vocabulary
    with pytest.raises(ValueError, match=rf"expert {odd} \(lanes\[2\]\).*per_expert_tokenization"):
        EnsembleScorer(cfg, World())
    cfg.plan.per_expert_tokenization = True  # byte-level tokenizers on a shared byte grid: allowed
    result = EnsembleScorer(cfg, World()).evaluate(["licenses"])
    assert set(result["licenses"]["experts"]) == set(cfg.plan.final_experts())


def test_uniform_and_average_perplexity_match_a_hand_computation(tmp_path):
    cfg = tiny_hdee_config(tmp_path, weightings=["uniform", "average"])
    paths = save_random_experts(cfg)
    result = EnsembleScorer(cfg, World()).evaluate(["arithmetic"])["arithmetic"]

    tok = ByT5Tokenizer()
    blocks = build_corpus(cfg.data, tok).split("test", "arithmetic")[: cfg.eval.max_blocks]
    logp = torch.stack(
        [token_logprobs(build_model(cfg.model.__class__(pretrained=str(p))), blocks) for p in paths]
    ).double()
    k, n = logp.shape[0], logp[0].numel()
    # average: log mean_j p_j
    avg = torch.logsumexp(logp, 0) - math.log(k)
    assert result["weightings"]["average"] == pytest.approx(math.exp(-avg.sum().item() / n), rel=1e-5)
    # uniform prior: w_{j,t} proportional to prod_{s<t} p_j(x_s); the first token uses the prior alone
    total = 0.0
    for b in range(logp.shape[1]):
        for t in range(logp.shape[2]):
            w = torch.softmax(logp[:, b, :t].sum(-1), 0) if t else torch.full((k,), 1 / k, dtype=torch.float64)
            total += math.log((w * logp[:, b, t].exp()).sum().item())
    assert result["weightings"]["uniform"] == pytest.approx(math.exp(-total / n), rel=1e-5)
    for name, p in zip(cfg.plan.final_experts(), logp):
        assert result["experts"][name] == pytest.approx(math.exp(-p.sum().item() / n), rel=1e-5)
    assert result["tokens"] == n


def test_cached_prior_is_fit_on_the_validation_split_only(tmp_path, monkeypatch):
    cfg = tiny_hdee_config(tmp_path, weightings=["cached", "topk"])
    save_random_experts(cfg)
    seen = []
    real = CachedPrior.update

    def spy(self, token_logp, *, split):
        seen.append((split, token_logp.shape[1]))
        return real(self, token_logp, split=split)

    monkeypatch.setattr(CachedPrior, "update", spy)
    result = EnsembleScorer(cfg, World()).evaluate(["licenses"])["licenses"]
    assert {s for s, _ in seen} == {"val"}
    assert sum(n for _, n in seen) >= cfg.eval.prior_sequences
    assert sum(result["cached_prior"]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="validation split only"):
        CachedPrior(3).update(torch.zeros(3, 1, 4), split="test")


def test_score_text_covers_every_token_of_the_file(tmp_path):
    cfg = tiny_hdee_config(tmp_path, weightings=["uniform", "topk", "average"])
    save_random_experts(cfg)
    text = "def f(x):\n    return x + 1\n" * 5  # 135 bytes: four 32-byte blocks and a 7-byte tail
    result = EnsembleScorer(cfg, World()).score_text(text)
    assert len(text.encode()) == 135
    assert result["tokens"] == 4 * 31 + 6  # every token but each sequence's first
    assert all(1 < v < 1e6 for v in result["weightings"].values())


def test_a_plan_other_than_the_trained_one_is_refused(tmp_path):
    cfg, other = tiny_hdee_config(tmp_path), tiny_hdee_config(tmp_path, widths=(64, 64, 64))
    check_saved_plan(cfg, cfg)
    with pytest.raises(ValueError, match="another plan"):
        check_saved_plan(cfg, other)
    with pytest.raises(FileNotFoundError, match="lanes\\[0\\]"):
        expert_refs(cfg)
