"""DHT-side limits without a network: subkey caps, Sybil-proof peer selection, valid-only min_peers,
replay marks that fresh keys cannot evict."""

import time
import zlib
from collections import Counter
from types import SimpleNamespace

import pytest

from decentrain.algorithms.sapo.payload import PayloadDecoder, PayloadLimits, RolloutPayload, encode_payload
from decentrain.algorithms.sapo.peer_selection import PeerSelector
from decentrain.core.identity import NodeIdentity
from decentrain.testing import rerun_unprivileged, run_in_threads


def test_registry_and_chunk_subkeys_are_capped():
    pytest.importorskip("hivemind")
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import get_dht_time
    from hivemind.utils.serializer import MSGPackSerializer

    from decentrain.algorithms.sapo.dht_guard import SwarmRecordValidator, chunk_subkey, registry_key, rollouts_key

    v = SwarmRecordValidator("p", max_ttl_s=60, max_record_bytes=1 << 20)
    marker = b"[owner:ssh-rsa " + b"A" * 372 + b"]"
    exp = get_dht_time() + 30
    reg = DHTID.generate(source=registry_key("p")).to_bytes()
    own = DHTID.generate(source=rollouts_key("p", marker)).to_bytes()
    one = MSGPackSerializer.dumps(1)

    def ok(key, subkey, value=one):
        return v.validate(DHTRecord(key, MSGPackSerializer.dumps(subkey), value, exp))

    chunk = MSGPackSerializer.dumps({"round": 2, "n": 4, "payload": b"x" * 1000})
    assert ok(reg, marker)
    assert ok(own, chunk_subkey(marker, 3), chunk)
    # ~700 KB of junk around one valid marker: what eclipsed an honest sender before.
    assert not ok(reg, b"J" * 700_000 + marker)
    assert not ok(reg, b"J" * 100 + marker)
    assert not ok(own, b"J" * 100 + chunk_subkey(marker, 3), chunk)
    assert not ok(own, chunk_subkey(marker, 3) + b"x", chunk)
    assert not ok(own, marker + b"#0003", chunk)
    huge = b"[owner:ssh-rsa " + b"A" * 5000 + b"]"
    assert not ok(DHTID.generate(source=registry_key("p")).to_bytes(), huge)


def test_values_that_do_not_decode_to_an_honest_shape_are_refused_at_store_time():
    """hivemind checks a record's bytes when it is stored and deserializes them only when a
    lookup ends: the signed 1-byte registry value b"\xc1" (not msgpack) passed both validators,
    then every registry lookup died in the DHT process and waited rpc_timeout_s. Every value
    now decodes, with its honest shape, before it is accepted."""
    pytest.importorskip("hivemind")
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import get_dht_time
    from hivemind.utils.serializer import MSGPackSerializer

    from decentrain.algorithms.sapo.dht_guard import SwarmRecordValidator, chunk_subkey, registry_key, rollouts_key

    v = SwarmRecordValidator("p", max_ttl_s=60, max_record_bytes=1 << 20)
    marker = b"[owner:ssh-rsa " + b"A" * 372 + b"]"
    reg = DHTID.generate(source=registry_key("p")).to_bytes()
    own = DHTID.generate(source=rollouts_key("p", marker)).to_bytes()

    def ok(key, subkey, value, raw=False):
        return v.validate(
            DHTRecord(
                key,
                MSGPackSerializer.dumps(subkey),
                value if raw else MSGPackSerializer.dumps(value),
                get_dht_time() + 30,
            )
        )

    assert ok(reg, marker, 1)
    for junk in (b"\xc1", b"\x01\x01", b"", b"\xc7\x01\x05a", b"\x91"):  # not msgpack, trailing, ext, truncated
        assert not ok(reg, marker, junk, raw=True)
    for value in (2, True, "1", 1.0, [1], {"a": 1}, b"1"):
        assert not ok(reg, marker, value)
    assert not ok(reg, marker.decode(), 1)  # the marker as a str subkey: not what a node writes

    good = {"round": 3, "n": 2, "payload": b"z" * 100}
    assert ok(own, chunk_subkey(marker, 1), good)
    for bad in (
        {**good, "n": 1},  # index 1 of a 1-chunk record
        {**good, "extra": 0},
        {"round": 3, "n": 2},
        {**good, "round": True},
        {**good, "round": -1},
        {**good, "n": 10**6},
        {**good, "payload": "z" * 100},
        {**good, "payload": b"z" * (13 << 10)},
        [3, 2, b"z"],
        None,
        1,
    ):
        assert not ok(own, chunk_subkey(marker, 1), bad), bad
    for junk in (b"\xc1", MSGPackSerializer.dumps(good) + b"\x00", b"\x83\xa5round"):
        assert not ok(own, chunk_subkey(marker, 1), junk, raw=True)


def test_a_failed_registry_lookup_keeps_the_last_good_peer_list():
    """A registry lookup that fails (poisoned, or timed out) used to age every known peer as if
    the registry had come back empty, so a node under attack forgot its peers after max_ttl_s."""
    pytest.importorskip("hivemind")
    from concurrent.futures import Future

    failed = Future()
    failed.set_exception(RuntimeError("could not deserialize"))
    x = _exchange_without_dht(SimpleNamespace(get=lambda *a, **k: failed), ttl_s=5.0, max_ttl_s=10.0)
    x.peers.listed(b"[owner:peer]", time.monotonic() - 3600)  # last listed an hour ago
    x._refresh_peers()
    assert b"[owner:peer]" in x.known and x.drops["registry_lookup_failed"] == 1
    x.dht = SimpleNamespace(get=lambda *a, **k: SimpleNamespace(result=lambda timeout=None: None))
    x._refresh_peers()  # a lookup that succeeds and does not list it: now it is forgotten
    assert b"[owner:peer]" not in x.known


def test_a_few_sybils_cannot_crowd_out_peers_with_valid_payloads():
    sel = PeerSelector(max_peers_per_round=32, max_known=1024, seed=0)
    honest = [f"h{i}" for i in range(4)]
    sybils = [f"s{i}" for i in range(32)]
    for p in honest:
        sel.listed(p, 0.0)
    for r in range(3):  # honest peers deliver valid payloads before the Sybils arrive
        trusted, explore = sel.choose(r, set())
        for p in trusted + explore:
            sel.contributed(p)
        sel.end_round()
    for p in sybils:
        sel.listed(p, 1.0)  # listed after, and more recently than, the honest peers
    reads = Counter()
    for r in range(3, 23):
        trusted, explore = sel.choose(r, set())
        assert len(trusted) + len(explore) == 32
        reads.update(trusted + explore)
        for p in honest:
            if p in trusted + explore:
                sel.contributed(p)
        sel.end_round()
    assert all(reads[p] == 20 for p in honest)  # every round, despite 32 fresh keys
    assert all(reads[p] >= 1 for p in sybils)  # and every listed peer gets its floor


def test_new_peers_get_a_read_within_a_window():
    sel = PeerSelector(max_peers_per_round=4, max_known=1024, seed=1)
    for i in range(40):
        sel.listed(f"p{i}", 0.0)
    seen = set()
    for r in range(20):  # 4 slots, 40 peers, no merit yet: all read within 10 rounds
        trusted, explore = sel.choose(r, set())
        seen.update(trusted + explore)
    assert len(seen) == 40


def test_a_full_table_forgets_peers_without_merit_first():
    sel = PeerSelector(max_peers_per_round=8, max_known=4, seed=0)
    sel.listed("honest", 0.0)
    sel.contributed("honest")
    for i in range(10):
        sel.listed(f"s{i}", 1.0 + i)
    gone = sel.forget(now=11.0, max_age_s=100.0)
    assert "honest" in sel.known and len(sel.known) == 4 and len(gone) == 7


def _signed(ident, round_, t):
    return encode_payload(RolloutPayload(ident.node_id, round_, t, (), name="n"), ident)


def test_fresh_keys_do_not_evict_a_standing_peers_replay_mark():
    dec = PayloadDecoder(PayloadLimits(max_peers_tracked=16))
    peer = NodeIdentity.generate()
    t = time.time()
    old = _signed(peer, 0, t)
    for r in range(3):
        assert dec(_signed(peer, r, t + r) if r else old, current_round=r) is not None
    for _ in range(40):  # fresh ids, one payload each
        assert dec(_signed(NodeIdentity.generate(), 2, t + 5), current_round=2) is not None
    assert peer.node_id in dec.high_water
    assert dec(old, current_round=0) is None  # its round-0 payload replayed: still refused
    assert dec.peek(_signed(peer, 3, t + 9), current_round=3) is not None
    assert dec.peek(old, current_round=0) is None and dec.drops.counts["replayed"] == 1


def _exchange_without_dht(dht, **hivemind):
    """A HivemindExchange whose DHT is `dht` (a fake): no p2p daemon, no network."""
    from decentrain.algorithms.sapo.exchange import hivemind as ex

    x = object.__new__(ex.HivemindExchange)
    x.cfg = ex.ExchangeConfig(name="hivemind", hivemind=ex.HivemindConfig(**hivemind))
    x.hcfg = x.cfg.hivemind
    x.peers = PeerSelector(32, 1024)
    x.high_water, x.digests, x.drops, x.starved_rounds = {}, ex.OrderedDict(), Counter(), 0
    x.registry_reads, x.expirations = 0, {}
    x.marker, x.registry, x.own_key = b"[owner:me]", "p/registry", "p/me"
    if not hasattr(dht, "run_coroutine"):  # the per-round read of slow-peer charges: none
        dht.run_coroutine = lambda fn, return_future=False: SimpleNamespace(result=lambda timeout=None: {})
    x.dht = dht
    return x


def _one_peer_exchange(monkeypatch, peer: bytes, round_: int, data: bytes, polls: list | None = None):
    """An exchange whose only listed peer always holds `data` for `round_` (no DHT); wait_s 0.3 s.
    Each look at the peers (the first and one per poll) appends to `polls`."""
    x = _exchange_without_dht(
        SimpleNamespace(get=lambda *a, **k: SimpleNamespace(result=lambda timeout=None: None)),
        wait_s=0.3,
        poll_s=0.05,
        min_peers=1,
    )
    monkeypatch.setattr(x, "_publish", lambda r, d: None, raising=False)
    looks = [] if polls is None else polls
    monkeypatch.setattr(
        x, "_refresh_peers", lambda: looks.append(1) or x.peers.listed(peer, time.monotonic()), raising=False
    )
    monkeypatch.setattr(x, "_assemble", lambda m, found: (round_, zlib.compress(data)), raising=False)
    return x


def test_min_peers_counts_only_valid_records(monkeypatch):
    pytest.importorskip("hivemind")

    # One attacker record that fails validation, polled until wait_s.
    x = _one_peer_exchange(monkeypatch, b"attacker", 7, b"junk")
    t = time.monotonic()
    assert x.exchange(7, b"mine", is_valid=lambda rec: False) == []
    assert time.monotonic() - t >= 0.3  # kept waiting for a valid peer instead of returning at once
    assert x.drops["invalid_payload"] == 1 and not x.peers.merit


def test_min_peers_counts_only_records_that_end_the_wait(monkeypatch):
    pytest.importorskip("hivemind")

    # A valid record that the caller says ends no wait (its sender delivered nothing usable while
    # others did): returned, but polled on until wait_s instead of closing the round at once.
    x = _one_peer_exchange(monkeypatch, b"newcomer", 7, b"valid")
    t = time.monotonic()
    out = x.exchange(7, b"mine", is_valid=lambda rec: True, ends_wait=lambda rec: False)
    assert [r.data for r in out] == [b"valid"]
    assert time.monotonic() - t >= 0.3
    assert not x.peers.merit  # nor does it earn its key read priority
    polls: list = []
    x = _one_peer_exchange(monkeypatch, b"newcomer", 8, b"useful", polls)
    assert [r.data for r in x.exchange(8, b"mine2", is_valid=lambda rec: True, ends_wait=lambda rec: True)] == [
        b"useful"
    ]
    assert len(polls) == 1  # a record that counts ends the wait at the first look: no poll after it
    assert x.peers.merit == {b"newcomer": pytest.approx(0.9)}  # one valid payload, decayed at the round's end


def test_a_dht_call_that_never_returns_costs_the_round_not_the_node():
    """hivemind's futures carry no deadline: a get or store that never answers (a hung DHT
    process, a peer that never replies) used to block the node for good. Now every call waits
    at most rpc_timeout_s; the lost lookups and the skipped publication are counted."""
    pytest.importorskip("hivemind")
    from concurrent.futures import Future

    never = SimpleNamespace(get=lambda *a, **k: Future(), store=lambda *a, **k: Future())  # never resolved
    x = _exchange_without_dht(never, wait_s=0.0, rpc_timeout_s=0.2)
    x.peers.listed(b"[owner:peer]", time.monotonic())
    t = time.monotonic()
    out = run_in_threads(lambda _: x.exchange(0, b"mine"), 1, timeout=20)  # fails if the exchange blocks
    assert out == [[]] and time.monotonic() - t < 5
    assert x.drops["own_publish_failed"] == 1  # the first chunk's store hung: nothing more was stored
    assert x.drops["registry_lookup_failed"] == 1 and x.drops["lookup_error"] == 1


def test_as_an_ordinary_user():
    rerun_unprivileged(__file__, "decode_to_an_honest_shape or failed_registry_lookup")
