"""SAPO results a person can read: a short line per round, and per node a summary.json and
reward.png (own-rollout reward, batch reward, held-out accuracy) next to its metrics.jsonl.
On the old code node 0 printed one 24-field line per round and nothing summarised a run."""

import json
import logging

from decentrain.algorithms.sapo.evaluation import RLEvalConfig
from decentrain.algorithms.sapo.results import round_line
from decentrain.algorithms.sapo.rounds import run_sapo
from decentrain.core.world import World
from decentrain.testing import tiny_sapo_config


def test_round_line_names_own_swarm_batch_external_and_heldout():
    line = round_line(
        "node0",
        12,
        {
            "reward": 0.3125,
            "batch_reward": 0.5,
            "external_groups": 4,
            "external_received": 6,
            "heldout_greedy/mean": 0.25,
            "heldout_greedy/x": 0.0,
        },
        0.28,
    )
    assert line == (
        "round 12 node0 | own reward 0.312 (swarm mean 0.280) | batch 0.500 | "
        "external groups 4 used of 6 received | held-out 0.250"
    )
    assert "held-out" not in round_line("n", 1, {"reward": 0.0}, None)


def test_a_run_ends_with_a_summary_and_a_reward_plot_per_node(tmp_path, caplog):
    cfg = tiny_sapo_config(rounds=3, eval=RLEvalConfig(every=2, prompts_per_task=3))
    with caplog.at_level(logging.INFO, logger="decentrain.algorithms.sapo"):
        run_sapo(cfg, World(), tmp_path)
    node = tmp_path / "node0"
    rows = [json.loads(line) for line in (node / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((node / "summary.json").read_text())
    rounds = [r for r in rows if "reward" in r]
    assert summary["rounds"] == len(rounds) == 3
    assert (
        summary["heldout_first"] == rows[0]["heldout_greedy/mean"]
        and summary["heldout_last"] == rows[-1]["heldout_greedy/mean"]
    )
    assert summary["own_reward_last"] == rounds[-1]["reward"]  # window of 1 round at 3 rounds
    assert (node / "reward.png").stat().st_size > 1000
    # without the rank tag ("[rank 0] "), which is in the message once a World has tagged this process's records
    lines = [
        r.getMessage().split("] ", 1)[-1] if r.getMessage().startswith("[rank") else r.getMessage()
        for r in caplog.records
    ]
    assert any(m.startswith("round 3 node0 | own reward") for m in lines)
    assert any(m.startswith("node0: 3 rounds | own reward") and str(node) in m for m in lines)
