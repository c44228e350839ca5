"""Hostile DHT record shapes against the real HivemindExchange on loopback.

Three DHT nodes: honest receiver `a`, honest sender `b`, and a raw hivemind DHT `x` that stores
whatever it likes (benchmarks/dht_attack_shapes.py), aimed at the old single key `<prefix>/rollouts` and at the
current layout's keys. After each attack, `a` must still receive and decode `b`'s groups.
"""

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("hivemind")
pytestmark = pytest.mark.integration

PREFIX = "atk"
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the shapes live beside the benchmark that also uses them

from benchmarks import dht_attack_shapes as shapes  # noqa: E402

ATTACKS = [*shapes.SHAPES, "stale_replay"]


def _payload(node_id: str, round_: int) -> bytes:
    from decentrain.algorithms.sapo.payload import RolloutGroup, RolloutPayload, encode_payload

    groups = (RolloutGroup(f"q{round_}", "4", "basic_arithmetic", {}, ("4", "5")),)
    return encode_payload(RolloutPayload(node_id, round_, time.time(), groups))


@pytest.mark.parametrize("attack", ATTACKS)
def test_honest_node_still_gets_the_honest_peers_groups(attack):
    from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig, build_exchange
    from decentrain.algorithms.sapo.payload import PayloadDecoder, PayloadLimits
    from decentrain.core.world import World

    def cfg(peers, wait_s):
        return ExchangeConfig(name="hivemind", hivemind=HivemindConfig(wait_s=wait_s, prefix=PREFIX, initial_peers=peers))

    a = build_exchange(cfg([], 5.0), World(), "a")
    b = build_exchange(cfg(a.maddrs, 0.0), World(), "b")  # b only publishes
    x = shapes.attacker_dht(a.maddrs)
    decoder = PayloadDecoder(PayloadLimits(num_generations=2))
    try:
        b.exchange(0, _payload("b", 0))
        assert [r.round for r in a.exchange(0, _payload("a", 0))] == [0]  # before the attack
        if attack == "stale_replay":  # b's round-0 record, which a already took, comes back as round 0
            assert shapes.run_capture(x, PREFIX) > 0
            assert shapes.run_replay(x, PREFIX) > 0
        else:
            assert shapes.run_shape(x, attack, PREFIX) > 0
        got = []
        for r in (1, 2):  # the honest peer's next two rounds both arrive
            b.exchange(r, _payload("b", r))
            recs = a.exchange(r, _payload("a", r))
            got += [p for rec in recs if (p := decoder(rec.data, current_round=r, source=rec.source)) is not None]
        assert [(p.node_id, p.round, p.groups[0].question) for p in got] == [("b", 1, "q1"), ("b", 2, "q2")]
    finally:
        for node in (a, b):
            node.close()
        x.shutdown()
