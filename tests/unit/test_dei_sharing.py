"""Sharing elites through the job's store: signed, capped, attributed to the slot's key; a dead peer costs its
elites."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from decentrain.algorithms.dei.sharing import ShareConfig, StoreSharing, decode, encode
from decentrain.core.identity import NodeIdentity


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def _node(store, rank, world, cfg=ShareConfig(deadline_s=0.5)):
    return StoreSharing(store, rank, world, NodeIdentity.generate(), cfg, run_key="t")


def test_live_peers_get_each_others_elites_and_a_dead_peer_costs_only_its_own(store):
    a, b = _node(store, 0, 3), _node(store, 1, 3)  # rank 2 never starts: a dead peer
    a.publish(0, ["MOV.I $0, $1"])
    b.publish(0, ["DAT.F #0, #0", "SPL.B $0, $0"])
    assert a.collect(0) == {1: ["DAT.F #0, #0", "SPL.B $0, $0"]}
    assert b.collect(0) == {0: ["MOV.I $0, $1"]}
    assert a.drops == Counter(missing=1) and b.drops == Counter(missing=1)


def test_a_node_cannot_speak_for_another(store):
    a, b = _node(store, 0, 2), _node(store, 1, 2)
    mallory = NodeIdentity.generate()
    # a payload under b's slot, signed by another key: refused
    store.set("t/r0/1", encode(mallory, 0, ["MOV.I $0, $1"]))
    assert a.collect(0) == {} and a.drops["bad_signature"] == 1
    # and b's key slot is write-once: a second writer cannot take it
    with pytest.raises(RuntimeError, match="held by another key"):
        StoreSharing(store, 1, 2, mallory, ShareConfig(), run_key="t")
    b.publish(1, ["MOV.I $0, $1"])
    assert a.collect(1) == {1: ["MOV.I $0, $1"]}


@pytest.mark.parametrize(
    "elites,reason",
    [
        (["x" * 20000] * 4, "too_large"),  # refused on its size, before any parsing
        ([f"MOV.I $0, ${i}" for i in range(5)], "bad_elites"),  # more than max_elites_per_peer
    ],
)
def test_caps_and_counts(elites, reason):
    me = NodeIdentity.generate()
    drops: Counter[str] = Counter()
    assert decode(encode(me, 0, elites), ShareConfig(), 0, me.node_id, drops) == []
    assert drops == Counter({reason: 1})


def test_stale_round_and_bad_schema_are_refused():
    me = NodeIdentity.generate()
    drops: Counter[str] = Counter()
    assert decode(encode(me, 3, ["MOV.I $0, $1"]), ShareConfig(), 4, me.node_id, drops) == []
    body = b'{"v":1,"node":"' + me.node_id.encode() + b'","round":0,"elites":[1]}'
    forged = bytes.fromhex(me.sign(body).decode()) + body
    assert decode(forged, ShareConfig(), 0, me.node_id, drops) == []
    assert drops == Counter(wrong_round=1, bad_elites=1)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_decode_is_total(data):
    me = NodeIdentity.generate()
    drops: Counter[str] = Counter()
    assert decode(data, ShareConfig(), 0, me.node_id, drops) == []
    assert sum(drops.values()) == 1


@pytest.mark.slow  # a fresh interpreter as uid nobody: nothing here may depend on root
def test_as_an_ordinary_user():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "not test_as_an_ordinary_user")
