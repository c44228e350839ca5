"""benchmarks/sapo_swarm.py's bookkeeping: resumed metrics, signal shares, paired ratios, drawdowns."""

import json

import numpy as np
import pytest

from benchmarks import sapo_swarm as S
from benchmarks.common import round_rows


def _node(reward, mixed, recv=0, equal=0, used=0, local=4, batch=None, heldout=(0.2, 0.3)):
    n = len(reward)
    return {
        "reward": reward,
        "batch_reward": batch or reward,
        "heldout": {0: heldout[0], n: heldout[1]},
        "local_groups": [local] * n,
        "local_mixed_groups": mixed,
        "external_received": [recv] * n,
        "external_equal_rewards": [equal] * n,
        "external_unscorable": [0] * n,
        "external_groups": [used] * n,
        "trained_completions": [0] * n,
        "accuracy": [r / 2 for r in reward],
        "payloads_dropped": 0,
        "time_s": {"generate": 1.0, "exchange": 0.0, "train": 1.0, "round": 2.0},
    }


def test_rows_keeps_the_last_row_of_a_round_logged_twice(tmp_path):
    # A run resumed from its round-2 checkpoint logs round 3 again; a torn last line is skipped.
    p = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "reward": 0.1},
        {"step": 2, "reward": 0.2},
        {"step": 3, "reward": 0.0},
        {"step": 3, "reward": 0.3},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 4, "rew')
    assert [r["reward"] for r in round_rows(p)] == [0.1, 0.2, 0.3]


def test_drawdowns_by_hand():
    # Window 1: the curve itself. Peak 0.5 then 0.2: drawdown 0.3; falls 0.3 + 0.1, rises 0.5 + 0.1.
    d = S.drawdowns(np.array([0.0, 0.5, 0.2, 0.3, 0.2]), window=1)
    assert d["max_drawdown"] == pytest.approx(0.3)
    assert d["total_fall"] == pytest.approx(0.4)
    assert d["total_rise"] == pytest.approx(0.6)
    # Window 2 averages pairs first: [0.25, 0.35, 0.25, 0.25] -> one fall of 0.1.
    assert S.drawdowns(np.array([0.0, 0.5, 0.2, 0.3, 0.2]), window=2)["max_drawdown"] == pytest.approx(0.1)


def test_signal_shares_and_paired_ratios():
    b = S.BenchConfig(nodes=2, rounds=2, splits="8/0,4/4")
    runs = {
        ("8/0", 0): {
            "wall_s": 1.0,
            "nodes": {"node0": _node([0.1, 0.1], [2, 0], local=8), "node1": _node([0.1, 0.1], [0, 0], local=8)},
        },
        ("8/0", 1): {
            "wall_s": 1.0,
            "nodes": {"node0": _node([0.2, 0.2], [1, 1], local=8), "node1": _node([0.2, 0.2], [1, 1], local=8)},
        },
        # 4 groups received per round, 1 of them all-equal: 3/4 carry signal; 3 used per round.
        # 4/4: batches hold peers' groups (higher batch reward); held-out gain 0.2 against 8/0's 0.1.
        ("4/4", 0): {
            "wall_s": 1.0,
            "nodes": {
                f"node{i}": _node([0.2, 0.2], [1, 1], recv=4, equal=1, used=3, batch=[0.4, 0.4], heldout=(0.2, 0.4))
                for i in range(2)
            },
        },
        ("4/4", 1): {
            "wall_s": 1.0,
            "nodes": {
                f"node{i}": _node([0.3, 0.3], [1, 1], recv=4, equal=1, used=3, batch=[0.6, 0.6], heldout=(0.2, 0.4))
                for i in range(2)
            },
        },
    }
    out = S.analyze(b, [0, 1], runs)
    eight, four = out["splits"]["8/0"], out["splits"]["4/4"]
    assert eight["swarm_cumulative_reward"]["values"] == pytest.approx([0.4, 0.8])
    assert eight["external_signal_share"] is None  # J=0 scores no peer group
    assert eight["local_mixed_share"]["values"] == pytest.approx([2 / 32, 4 / 32])
    assert four["external_signal_share"]["mean"] == pytest.approx(0.75)
    assert four["local_mixed_share"]["mean"] == pytest.approx(0.25)
    assert four["signal_groups_per_round"]["mean"] == pytest.approx(4.0)
    # Ratios are paired by seed: 0.8/0.4 and 1.2/0.8.
    assert out["ratio_4_4"]["values"] == pytest.approx([2.0, 1.5])
    assert out["ratio_4_4"]["mean"] == pytest.approx(1.75)
    # The paper's statistic (batch reward) beside the own-rollout one; the target is on held-out gain.
    assert four["batch_ratio_to_8_0"]["values"] == pytest.approx([4.0, 3.0])
    assert eight["heldout_last3_gain"]["mean"] == pytest.approx(0.1) and four["heldout_last3_gain"][
        "mean"
    ] == pytest.approx(0.2)
    assert out["heldout_gain_ratio_4_4"] == pytest.approx(2.0)
    assert out["target_met"] is True
    assert four["reward_minus_8_0_per_round"] == pytest.approx([0.1, 0.1])
    # Paired by seed: batch cumulative reward 4/4 - 8/0 = [1.6 - 0.4, 2.4 - 0.8] = [1.2, 1.6]: mean 1.4, std 0.2828,
    # t = 1.4 / (0.2828 / sqrt 2) = 7.0 on 1 degree of freedom, p = 1 - 2 atan(7) / pi = 0.0903.
    pb = four["paired_vs_8_0"]["batch_cumulative_reward"]
    assert pb["diff"]["values"] == pytest.approx([1.2, 1.6]) and pb["n"] == 2
    assert pb["t"] == pytest.approx(7.0) and pb["p"] == pytest.approx(1 - 2 * np.arctan(7.0) / np.pi)
    assert "t" not in four["paired_vs_8_0"]["heldout_last3_gain"]  # equal differences (0.1, 0.1): no spread, no test
    # Selection alone: a batch of 4 own groups at 0.2 and 3 external ones holds 0.4 x 7, so an external completion
    # earns (2.8 - 0.8) / 3 = 2/3 (seed 1: (4.2 - 1.2) / 3 = 1), rho = 10/3 on both seeds: (4 + 4 rho) / 8 = 13/6.
    assert four["external_reward_rate"]["values"] == pytest.approx([2 / 3, 1.0])
    assert four["selection_only_batch_ratio"]["values"] == pytest.approx([13 / 6, 13 / 6])
    assert (
        eight["selection_only_batch_ratio"]["values"] == pytest.approx([1.0, 1.0])
        and eight["external_reward_rate"] is None
    )
    assert out["rl_start"]["accuracy"]["mean"] == pytest.approx((0.05 + 0.1 + 0.1 + 0.15) / 4)


def test_heldout_is_the_mean_of_the_last_three_evaluations_after_the_start():
    curve = {"0": 0.1, "10": 0.9, "20": 0.2, "30": 0.3, "40": 0.4}  # JSON keys come back as strings
    assert S.last_evals_mean(curve, [0, 10, 20, 30, 40]) == pytest.approx(0.3)
    assert S.last_evals_mean(curve, [0, 10]) == pytest.approx(0.9)  # fewer evaluations: those after the start
    assert S.last_evals_mean({0: 0.1}, [0]) == pytest.approx(0.1)
    # Per task where the run logged them: start -> last-3 mean and the gain.
    node = _node([0.1, 0.1], [0, 0], local=8, heldout=(0.2, 0.4))
    node["heldout_tasks"] = {"0": {"a": 0.1, "b": 0.3}, "2": {"a": 0.5, "b": 0.3}}
    out = S.summarize_run({"wall_s": 1.0, "nodes": {"node0": node}}, 0)
    assert out["heldout_tasks"]["a"] == pytest.approx({"start": 0.1, "last3": 0.5, "gain": 0.4})
    assert out["heldout_tasks"]["b"]["gain"] == pytest.approx(0.0)


def test_rl_overrides_pin_the_learning_setup():
    o = S.rl_overrides(S.BenchConfig(), "4/4", 0, ["m"], S.Path("r"))
    assert {
        "reward.kind=exact",
        "sampling.top_k=null",
        "sampling.temperature=1.0",
        "task=sapo_learn",
        "sapo=swarm_4_4",
    } <= set(o)
    assert not any(x.startswith(("nodes=", "loss.external_is")) for x in o)  # one warm start, no correction


def test_specialist_warm_starts_reach_each_node_and_the_is_arm_turns_the_correction_on(tmp_path):
    # Three leave-one-out subsets over 8 nodes: node n starts from warm start n % 3; "+is" adds loss.external_is.
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import recipes.rl

    b = S.BenchConfig(
        nodes=8, warm_start_tasks="chain_sum,leg_counting;basic_arithmetic,leg_counting;basic_arithmetic,chain_sum"
    )
    assert [S.node_warm_tasks(b, n) for n in (0, 1, 5)] == [
        ["chain_sum", "leg_counting"],
        ["basic_arithmetic", "leg_counting"],
        ["basic_arithmetic", "chain_sum"],
    ]
    assert S.parse_arm("4/4+is") == (4, 4, True) and S.parse_arm("8/0") == (8, 0, False)
    assert {"task.tasks=[chain_sum,leg_counting]", "~task.task_kwargs.basic_arithmetic"} <= set(
        S.sft_overrides(b, S.warm_start_subsets(b)[0])
    )
    with pytest.raises(ValueError, match="warm_start_tasks"):
        S.subset_overrides("sapo_mix", ["chain_sum", "no_such_task"])
    dirs = [f"warm/s{k}/model" for k in range(3)]
    o = S.rl_overrides(b, "4/4+is", 1, dirs, tmp_path / "r")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(S.ROOT / "conf"), version_base="1.3"):
        cfg = recipes.rl.to_config(compose(config_name="rl", overrides=o))
    assert cfg.loss.external_is and (cfg.batch.num_local, cfg.batch.num_external) == (4, 4)
    assert [cfg.for_node(n).model.pretrained for n in range(8)] == [str(S.ROOT / dirs[n % 3]) for n in range(8)]
    assert all(cfg.for_node(n).model.tokenizer == cfg.for_node(n).model.pretrained for n in range(8))


def test_gain_split_by_what_the_nodes_warm_start_trained_on():
    # node0 trained on a only, node1 on b only: node0's b and node1's a are 'missing'.
    def node(curves):
        n = _node([0.1, 0.1], [0, 0], local=8)
        n["heldout_tasks"] = {str(k): {t: c[i] for t, c in curves.items()} for i, k in enumerate((0, 10, 20))}
        return n

    nodes = {
        "node0": node({"a": [0.5, 0.5, 0.5], "b": [0.0, 0.2, 0.4]}),
        "node1": node({"a": [0.1, 0.1, 0.1], "b": [0.6, 0.7, 0.8]}),
    }
    g = S.gain_by_warm_start(nodes, [0, 10, 20], [["a"], ["b"]])
    # gains: node0 a 0, b 0.3 (missing); node1 a 0 (missing), b 0.15
    assert g["missing"] == pytest.approx(0.15) and g["trained"] == pytest.approx(0.075)
    assert g["start_missing"] == pytest.approx(0.05) and g["start_trained"] == pytest.approx(0.55)
    assert g["per_task"]["b"] == pytest.approx({"missing": 0.3, "trained": 0.15})
    # one shared warm start: every pair is 'trained'
    assert S.gain_by_warm_start(nodes, [0, 10, 20], [None, None])["missing"] is None


def test_learning_gate_summary_by_hand():
    from benchmarks import sapo_learning as L

    # Two seeds (JSON keys come back as strings); held-out = the mean of the evaluations after the start (up to 3):
    # 0.2 -> (0.35 + 0.35) / 2 and 0.2 -> (0.3 + 0.3) / 2: gains 0.15 and 0.1, mean 0.125, gate met.
    runs = [
        {
            "heldout": {"0": 0.2, "25": 0.35, "50": 0.35},
            "reward": [0.1] * 10 + [0.3] * 10,
            "wall_s": 1.0,
            "heldout_per_task": {"0": {"a": 0.1}, "25": {"a": 0.3}, "50": {"a": 0.5}},
        },
        {
            "heldout": {"0": 0.2, "25": 0.3, "50": 0.3},
            "reward": [0.1] * 20,
            "wall_s": 1.0,
            "heldout_per_task": {"0": {"a": 0.1}, "25": {"a": 0.1}, "50": {"a": 0.1}},
        },
    ]
    s = L.summarize(runs)
    assert s["steps"] == [0, 25, 50] and s["last3_steps"] == [25, 50]
    assert s["gain"]["values"] == pytest.approx([0.15, 0.1]) and s["gate_met"] is True
    assert s["tasks"]["a"]["gain"]["values"] == pytest.approx([0.3, 0.0])
    assert s["best"]["values"] == pytest.approx([0.35, 0.3])
    assert s["reward_last_10"]["values"] == pytest.approx([0.3, 0.1])
    runs[0]["heldout"]["50"] = 0.15  # the final evaluation alone no longer decides: last-3 mean 0.25
    assert L.summarize(runs)["gate_met"] is False  # mean gain 0.075 < 0.10
