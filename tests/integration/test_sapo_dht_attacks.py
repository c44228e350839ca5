"""Hostile DHT record shapes against the real HivemindExchange on loopback.

Three DHT nodes: honest receiver `a`, honest sender `b`, and a raw hivemind DHT `x` that stores
whatever it likes (decentrain/testing/dht_attacks.py), aimed at the old single key `<prefix>/rollouts` and at the
current layout's keys. After each attack, `a` must still receive `b`'s next payloads, and nothing else.
"""

import sys
from pathlib import Path

import pytest

pytest.importorskip("hivemind")
pytestmark = pytest.mark.integration

PREFIX = "atk"
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the shapes live beside the benchmark that also uses them

from decentrain.testing import dht_attacks as shapes  # noqa: E402
from decentrain.testing import rerun_unprivileged, run_in_fresh_process  # noqa: E402

ATTACKS = [*(s for s in shapes.SHAPES if s != "slow_responder"), "stale_replay"]  # slow: its own test below


def _payload(node_id: str, round_: int) -> bytes:
    """Stands in for an encoded payload: the exchange moves bytes, the decoder is tested elsewhere."""
    return f"{node_id}:{round_}:".encode() + bytes(range(256)) * 8


# The receiver's limits, small enough that the Sybil shape overflows them with 8 keys, not 32.
LIMITS = {"max_peers_per_round": 8, "max_fetch_bytes": 2 << 20}
SHAPE_KW = {"sybil_crowding": {"keys": 8, "chunks": 22}}  # 8 x 22 x 12 KiB > 2 MiB


@pytest.mark.parametrize("attack", ATTACKS)
def test_honest_node_still_gets_the_honest_peers_groups(attack):
    # A fresh process forks the DHTs, as a node's own process would (see run_in_fresh_process).
    run_in_fresh_process(_honest_peer_after, attack)


def _cfg(peers, wait_s, **limits):
    from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig

    return ExchangeConfig(
        name="hivemind", hivemind=HivemindConfig(wait_s=wait_s, prefix=PREFIX, initial_peers=peers, **LIMITS, **limits)
    )


def _honest_peer_after(attack: str) -> None:
    from decentrain.algorithms.sapo.exchange import build_exchange
    from decentrain.core.world import World

    cfg = _cfg

    a = build_exchange(cfg([], 5.0), World(), "a")
    b = build_exchange(cfg(a.maddrs, 0.0), World(), "b")  # b only publishes
    x = shapes.attacker_dht(a.maddrs)
    try:
        b.exchange(0, _payload("b", 0))
        assert [r.round for r in a.exchange(0, _payload("a", 0))] == [0]  # before the attack
        if attack == "stale_replay":  # b's round-0 record, which a already took, comes back as round 0
            assert shapes.run_capture(x, PREFIX) > 0
            assert shapes.run_replay(x, PREFIX) > 0
        else:
            assert shapes.run_shape(x, attack, PREFIX, **SHAPE_KW.get(attack, {})) > 0
        got = []
        for r in (1, 2):  # the honest peer's next two rounds both arrive
            b.exchange(r, _payload("b", r))
            recs = a.exchange(r, _payload("a", r))
            got += [(rec.data, rec.round) for rec in recs]
        assert got == [(_payload("b", 1), 1), (_payload("b", 2), 2)]
        assert a.drops["lookup_error"] == 0 and a.drops["registry_lookup_failed"] == 0
    finally:
        for node in (a, b):
            node.close()
        x.shutdown()


def test_a_slow_responder_is_charged_once_not_waited_on_every_round():
    """A member that answers every find and store after 2.5 s (under hivemind's 3 s per-call
    limit, so hivemind never bans it) was waited on by every store traversal and every latest
    lookup of every honest round: ~6 waits a round, 0.05 s exchanges became 10 s. Now the first
    slow answer is cut at slow_rpc_s and charges it (hivemind's blacklist), and lookups end at
    the first replica holding something new: the honest node calls it at most twice in 3 rounds.
    Counted by the attacker itself, per caller: no timing in the assertion."""
    run_in_fresh_process(_slow_responder_rounds)


def _slow_responder_rounds() -> None:
    from decentrain.algorithms.sapo.exchange import build_exchange
    from decentrain.core.world import World

    ban = {"slow_ban_s": 3600.0}  # one charge lasts the whole test, however slow the box
    a = build_exchange(_cfg([], 5.0, **ban), World(), "a")
    b = build_exchange(_cfg(a.maddrs, 0.0, **ban), World(), "b")
    x = shapes.attacker_dht(a.maddrs)
    try:
        b.exchange(0, _payload("b", 0))
        assert [r.round for r in a.exchange(0, _payload("a", 0))] == [0]
        assert shapes.run_shape(x, "slow_responder", PREFIX) == 1
        got = []
        for r in (1, 2, 3):
            b.exchange(r, _payload("b", r))
            got += [rec.round for rec in a.exchange(r, _payload("a", r))]
        assert got == [1, 2, 3]
        calls = shapes.run_slow_calls(x)
        assert calls.get(a.dht.peer_id.to_base58(), 0) <= 2, calls
        assert a.drops["slow_peer"] >= 1 or calls.get(a.dht.peer_id.to_base58(), 0) == 0
    finally:
        for node in (a, b):
            node.close()
        x.shutdown()


def test_as_an_ordinary_user():
    rerun_unprivileged(__file__, "registry_poison or slow_responder_is_charged")
