"""Held-out greedy accuracy in the SAPO loop: fixed questions from another dataset seed, logged at round 0 and every
`eval.every`."""

import json

import pytest

from decentrain.algorithms.sapo.evaluation import RLEvalConfig, heldout_items
from decentrain.algorithms.sapo.rounds import run_sapo
from decentrain.core.world import World
from decentrain.tasks import TaskMixConfig, TaskMixture
from decentrain.testing import EASY_TASKS, tiny_sapo_config


def test_heldout_items_are_fixed_and_come_from_another_seed():
    cfg = TaskMixConfig(**EASY_TASKS)
    a, b = heldout_items(cfg, 5, 1000), heldout_items(cfg, 5, 1000)
    assert list(a) == cfg.tasks and all(len(v) == 5 for v in a.values())
    assert a == b
    train = TaskMixture(cfg)
    assert {it.ref.seed for v in a.values() for it in v}.isdisjoint(train.seeds.values())


def test_eval_config_validation():
    with pytest.raises(ValueError, match="eval.every=-1"):
        RLEvalConfig(every=-1)
    with pytest.raises(ValueError, match="eval.prompts_per_task=0"):
        RLEvalConfig(prompts_per_task=0)


def test_loop_logs_heldout_greedy_accuracy_at_start_and_every_n_rounds(tmp_path):
    cfg = tiny_sapo_config(rounds=3, eval=RLEvalConfig(every=2, prompts_per_task=3))
    run_sapo(cfg, World(), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "node0" / "metrics.jsonl").read_text().splitlines()]
    with_eval = [r["step"] for r in rows if "heldout_greedy/mean" in r]
    assert with_eval == [0, 2, 3]  # the start, every 2 rounds, the last round
    r = rows[0]
    assert 0.0 <= r["heldout_greedy/mean"] <= 1.0 and {
        "heldout_greedy/chain_sum",
        "heldout_greedy/basic_arithmetic",
    } <= set(r)
