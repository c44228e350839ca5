"""Fresh identities cannot multiply a receiver's work, nor take more than a fair share of J slots.

The node-level tests import only what the code before the fix had, so they also run (and fail)
against it. Issue 25: 64 fresh keys, each under its per-sender budget, added 46 s of receiver CPU per round;
one key offering 64 usable groups cut an honest peer's expected share of 4 external slots to
0.25. Time is an injected clock (each rebuild or scoring block costs exactly STEP seconds), so
no outcome depends on this machine's speed.
"""

import time

import numpy as np
import pytest

from decentrain.algorithms.sapo.batching import build_swarm_batch
from decentrain.algorithms.sapo.node import SAPONode, group_of
from decentrain.algorithms.sapo.payload import RolloutPayload, encode_payload
from decentrain.core.identity import NodeIdentity
from decentrain.tasks import TaskMixture
from decentrain.testing import FixedExchange, tiny_sapo_config

STEP = 0.05  # seconds each timed block costs on the injected clock


class StepClock:
    """Advances STEP seconds every second reading: a timed block (two readings) costs exactly STEP."""

    def __init__(self):
        self.t, self.reads = 0.0, 0

    def __call__(self):
        self.reads += 1
        if self.reads % 2 == 0:
            self.t += STEP
        return self.t


def _payload(ident, groups):
    return encode_payload(RolloutPayload(ident.node_id, 0, time.time(), tuple(groups), name="p"), ident)


def _usable(mix, indices, tag):
    """Groups of real entries with one right answer: mixed rewards, distinct per `tag` (no duplicates)."""
    return [group_of(mix[i], (mix[i].answer + "\n", f"{tag}\n", "x\n", "y\n")) for i in indices]


def _node(records, round_budget_s=4.0, sender_budget_s=2.0, num_external=4, clock=None):
    cfg = tiny_sapo_config(exchange="collective", num_local=0, num_external=num_external)
    cfg.payload.max_groups = 64
    cfg.payload.sender_budget_s = sender_budget_s
    cfg.payload.round_budget_s = round_budget_s  # an attribute the code before the fix ignores
    node = SAPONode(cfg, 0, "node0", FixedExchange(records))
    node.budget.clock = clock or (lambda: 0.0)  # SenderBudget takes its clock; this node's is injected
    return node, cfg


def test_64_fresh_in_budget_identities_cost_at_most_the_round_cap():
    probe = tiny_sapo_config(exchange="collective", num_local=0, num_external=4)
    mix = TaskMixture(probe.task)
    sybils = [NodeIdentity.generate() for _ in range(64)]
    # each Sybil: 8 usable groups, 8 rebuilds + 8 scorings = 0.8 s, under its 2 s budget (51 s in all before)
    records = [
        (f"s{k}", _payload(s, _usable(mix, range(8 * k % 200, 8 * k % 200 + 8), k))) for k, s in enumerate(sybils)
    ]
    clock = StepClock()
    node, cfg = _node(records, round_budget_s=4.0, clock=clock)
    node.budget.start_round()
    external = node.share(0, [])
    build_swarm_batch([], external, node.rewards, cfg.batch, np.random.default_rng(0))
    spent = sum(node.budget.spent.values())
    assert spent <= 4.0 + STEP + 1e-9  # the cap is checked before each block: at most one block over
    assert spent >= 4.0 - 1e-9  # ... and the useful work up to it was done
    assert node.group_drops["round_over_budget"] > 0


def test_a_merited_peer_keeps_its_share_under_a_sybil_flood():
    probe = tiny_sapo_config(exchange="collective", num_local=0, num_external=4)
    mix = TaskMixture(probe.task)
    honest = NodeIdentity.generate()
    sybils = [NodeIdentity.generate() for _ in range(64)]
    records = [(f"s{k}", _payload(s, _usable(mix, range(8), k))) for k, s in enumerate(sybils)]
    records.append(("honest", _payload(honest, _usable(mix, range(100, 108), "h"))))  # read last
    node, cfg = _node(records, round_budget_s=4.0, clock=StepClock())
    node.budget.start_round()
    node.budget.credit(honest.node_id, 10)  # ten useful groups in earlier rounds
    external = node.share(0, [])
    batch = build_swarm_batch([], external, node.rewards, cfg.batch, np.random.default_rng(0))
    assert sum(a.sender == honest.node_id for a in external) == 8  # all of its groups rebuilt ...
    assert honest.node_id not in node.budget.dropped and batch.num_external == 4  # ... scored and drawn
    assert sum(node.budget.spent.values()) <= 4.0 + STEP + 1e-9


def test_split_gives_merit_half_and_never_exceeds_the_cap():
    from decentrain.algorithms.sapo.sender_budget import SenderBudget, split_round_budget

    merit = {"a": 3.0, "b": 1.0}
    senders = ["a", "b"] + [f"s{i}" for i in range(64)]
    split = split_round_budget(4.0, senders, merit, limit_s=2.0)
    assert sum(split.values()) <= 4.0 + 1e-9
    assert split["a"] == pytest.approx(1.5 + 2.0 / 66) and split["s0"] == pytest.approx(2.0 / 66)
    assert split_round_budget(4.0, ["x"], {}, limit_s=2.0) == {"x": 2.0}  # never above the per-sender limit
    b = SenderBudget(2.0, clock=lambda: 0.0, round_limit_s=1.0)
    b.start_round()
    b.plan(["x", "y"])
    b.charge("x", 0.4)
    assert not b.over("x") and not b.over("y")
    b.charge("x", 0.2)  # over its 0.5 s allowance
    assert b.over("x") and not b.over("y") and b.dropped_total == 1
    b.charge("y", 0.5)  # the round's cap is reached: nobody is served any more
    assert b.over("y") and b.rounds_capped == 1


def test_one_sender_offering_64_usable_groups_gets_no_more_than_a_fair_share_of_j():
    probe = tiny_sapo_config(exchange="collective", num_local=0, num_external=4)
    mix = TaskMixture(probe.task)
    sybil, honest = NodeIdentity.generate(), NodeIdentity.generate()
    records = [
        ("sybil", _payload(sybil, _usable(mix, range(64), "s"))),
        ("honest", _payload(honest, _usable(mix, range(100, 104), "h"))),
    ]
    node, cfg = _node(records, round_budget_s=8.0, sender_budget_s=8.0)
    node.budget.start_round()
    external = node.share(0, [])
    honest_questions = {g.question for g in _usable(mix, range(100, 104), "h")}
    counts = []
    for seed in range(30):
        batch = build_swarm_batch([], external, node.rewards, cfg.batch, np.random.default_rng(seed))
        assert batch.num_external == 4
        counts.append(sum(s.group.question in honest_questions for s in batch.groups if s.external))
    assert min(counts) == 2  # ceil(J / 2 senders): the honest peer's share (0.25 expected before)


def test_fair_quota_fills_every_slot_another_sender_cannot():
    from decentrain.algorithms.sapo.batching import fair_quota

    assert fair_quota(4, [64, 4]) == 2
    assert fair_quota(4, [10, 1]) == 3  # the single-group sender cannot use its second slot
    assert fair_quota(4, [1] * 64) == 1


@pytest.mark.slow  # a fresh interpreter as uid nobody (~40 s): nothing here may depend on root
def test_as_an_ordinary_user():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "not test_as_an_ordinary_user")
