"""One SAPO node in-process: round metrics, peers' payloads (good and hostile), exact resume."""

import torch
from safetensors.torch import load_file

from sapo_helpers import tiny_sapo_config

from decentrain.algorithms.sapo.batching import ScoredGroup
from decentrain.algorithms.sapo.exchange import PeerRecord
from decentrain.algorithms.sapo.grpo import SAPOLossConfig
from decentrain.algorithms.sapo.node import SAPONode
from decentrain.algorithms.sapo.payload import RolloutGroup, RolloutPayload, encode_payload
from decentrain.algorithms.sapo.trainer import run_sapo
from decentrain.core.world import World
from decentrain.tasks import RewardConfig


class FakeExchange:
    """Hands the node a fixed list of raw records, whatever it publishes."""

    def __init__(self, records=()):
        self.records, self.published = list(records), []

    def exchange(self, round_, payload):
        self.published.append((round_, payload))
        return [PeerRecord(source, data) for source, data in self.records]

    def close(self):
        pass


def _peer_payload(round_, node_id="peer", completions=("7\n", "3\n", "7\n", "x\n"), key=None):
    group = RolloutGroup("State the final answer to the following arithmetic problem: 3 + 4 =", "7", "chain_sum",
                         {"expression": "3 + 4"}, tuple(completions))
    return encode_payload(RolloutPayload(node_id, round_, 0.0, (group, group)), key)


def test_round_uses_peer_groups_and_counts_hostile_payloads():
    cfg = tiny_sapo_config(exchange="collective", num_local=2, num_external=2, swarm_key="k")
    records = [
        ("good", _peer_payload(0, key="k")),
        ("unsigned", _peer_payload(0)),
        ("stale", _peer_payload(-5, key="k")),
        ("junk", b"\x80\x81 not a payload"),
        ("equal", _peer_payload(0, completions=("1\n",) * 4, key="k")),
    ]
    ex = FakeExchange(records)
    node = SAPONode(cfg, 0, "node0", ex)
    m = node.run_round()
    assert ex.published and ex.published[0][0] == 0
    assert m["external_received"] == 4  # good (2 groups) + equal (2 groups)
    assert m["external_groups"] == 2 and m["local_groups"] == 2
    assert m["external_equal_rewards"] == 2
    assert m["payloads_dropped"] == 3
    assert m["dropped/unsigned"] == 1 and m["dropped/stale_round"] == 1 and m["dropped/bad_frame"] == 1
    for key in ("reward", "cumulative_reward", "time_generate", "time_exchange", "time_train", "loss"):
        assert key in m
    assert any(k.startswith("accuracy/") for k in m)


def test_zero_advantage_skip_gives_the_full_batch_gradient():
    # dapo skips zero-advantage completions; bnpo with one micro-batch computes every completion
    # and divides by the same token count, so the two gradients must agree.
    mixed = RolloutGroup("q 3 + 4 =", "7", "chain_sum", {}, ("7\n", "2\n", "7\n", "1\n"))
    equal = RolloutGroup("q 1 + 1 =", "2", "chain_sum", {}, ("5\n", "6\n", "5\n", "9\n"))
    batch = [ScoredGroup(mixed, [1.0, 0.0, 1.0, 0.0], True), ScoredGroup(equal, [0.0] * 4, True)]
    grads, trained = [], []
    for loss_type in ("dapo", "bnpo"):
        cfg = tiny_sapo_config(exchange="collective", num_local=0, num_external=2)
        cfg.loss = SAPOLossConfig(num_generations=4, loss_type=loss_type)
        node = SAPONode(cfg, 0, "node0", FakeExchange())
        node.optimizer = torch.optim.SGD(node.model.parameters(), lr=0.0)
        trained.append(node.train_step(batch)["trained_completions"])
        grads.append(torch.cat([p.grad.flatten() for p in node.model.parameters() if p.grad is not None]))
    assert trained == [4, 8]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def _cfg(stop_at=None):
    cfg = tiny_sapo_config(rounds=3, reward=RewardConfig(format_weight=0.5))  # format reward: mixed groups
    cfg.train.stop_at = stop_at
    return cfg


def test_resume_continues_exactly(tmp_path):
    full = []
    run_sapo(_cfg(), World(), tmp_path / "full", on_round=lambda n, m: full.append((m["reward"], m["trained_completions"])))
    part = []
    run_sapo(_cfg(stop_at=2), World(), tmp_path / "part", on_round=lambda n, m: part.append((m["reward"], m["trained_completions"])))
    run_sapo(_cfg(), World(), tmp_path / "part", on_round=lambda n, m: part.append((m["reward"], m["trained_completions"])))
    assert len(part) == 3 and any(n > 0 for _, n in full)  # some round took a policy step
    assert part == full
    a = load_file(str(tmp_path / "full" / "node0" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "node0" / "final" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k])


def test_spo_node_with_prioritized_sampling_runs_rounds():
    cfg = tiny_sapo_config(rounds=2, reward=RewardConfig(format_weight=0.5))
    cfg.loss = SAPOLossConfig(num_generations=4, advantage="spo")
    cfg.train.prioritized_sampling = True
    node = SAPONode(cfg, 0, "node0", FakeExchange())
    for _ in range(2):
        m = node.run_round()
    assert m["local_groups"] == 2 and node.advantage.alpha  # the tracker has seen prompts
