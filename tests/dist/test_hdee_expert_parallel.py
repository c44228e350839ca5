"""Experts spread over gloo ranks give the same ensemble perplexity as one process running them all."""

import pytest

from decentrain.algorithms.hdee.evaluate import EnsembleScorer
from decentrain.core.world import World
from decentrain.testing import run_ranks, save_random_experts, tiny_hdee_config

pytestmark = pytest.mark.dist
WEIGHTINGS = ["uniform", "cached", "topk", "average"]


def _evaluate(world, ensemble_dir):
    scorer = EnsembleScorer(tiny_hdee_config(ensemble_dir, weightings=WEIGHTINGS), world)
    return sorted(scorer.models), scorer.evaluate()


@pytest.mark.parametrize("world_size", [2])  # rank 0 holds two experts, rank 1 one
def test_expert_parallel_matches_one_process(tmp_path, world_size):
    save_random_experts(tiny_hdee_config(tmp_path))
    _, reference = _evaluate(World(), tmp_path)
    results = run_ranks(_evaluate, world_size, tmp_path)
    # round-robin placement: expert k on rank k % world_size
    assert [held for held, _ in results] == [list(range(r, 3, world_size)) for r in range(world_size)]
    for _, got in results:
        assert got.keys() == reference.keys()
        for domain, ref in reference.items():
            assert got[domain]["tokens"] == ref["tokens"]
            for w in WEIGHTINGS:
                assert got[domain]["weightings"][w] == pytest.approx(ref["weightings"][w], rel=1e-6), (domain, w)
            assert got[domain]["experts"] == pytest.approx(ref["experts"], rel=1e-6)
