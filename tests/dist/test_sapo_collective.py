"""The collective exchange on gloo ranks: every node sees the others' groups, nothing is unpickled."""

import pytest

from decentrain.algorithms.sapo.exchange import build_exchange
from decentrain.algorithms.sapo.node import SAPONode
from decentrain.algorithms.sapo.rounds import run_sapo
from decentrain.testing import run_ranks, tiny_sapo_config

pytestmark = pytest.mark.dist


def _on_rank(world, run_dir):
    cfg = tiny_sapo_config(exchange="collective", num_local=2, num_external=2, rounds=2)
    node = SAPONode(cfg, world.rank, f"node{world.rank}", build_exchange(cfg.exchange, world, f"node{world.rank}"))
    local = node.generate(0)
    external = node.share(0, local)
    rows = []
    summary = run_sapo(cfg, world, run_dir, on_round=lambda n, m: rows.append(m["external_received"]))
    return (
        [g.question for g in local],
        [a.group.question for a in external],
        node.decoder.drops.total,
        summary["rounds"],
        rows,
    )


def test_collective_swarm_on_two_ranks(tmp_path):
    out = run_ranks(_on_rank, 2, str(tmp_path))
    for rank, (_, external, dropped, rounds, rows) in enumerate(out):
        others = [q for r, o in enumerate(out) if r != rank for q in o[0]]
        assert external == others and dropped == 0
        assert rounds == 2 and rows == [2, 2]  # each round: the peer's 2 groups
    assert (tmp_path / "node1" / "metrics.jsonl").exists()
