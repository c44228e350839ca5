"""Hostile DHT record shapes, run inside an attacker's hivemind DHT process.

Each shape is `async def shape(dht, node, prefix) -> int` (records it stored), executed with
`attacker.run_coroutine(partial(shape, prefix=...))`, so that large values never cross
hivemind's command pipe (which breaks above 16 KiB, see dht_guard). Each aims at the old
single key `<prefix>/rollouts` and at the current layout: the registry and every listed
node's own key and chunk subkeys. Shared by tests/integration/test_sapo_dht_attacks.py and
benchmarks/swarm_attack.py.
"""

from __future__ import annotations

import os
from functools import partial

FAR_S = 1e9  # a far-future expiration, ~30 years


def _now() -> float:
    from hivemind.utils import get_dht_time

    return get_dht_time()


async def _victims(node, prefix: str) -> list[bytes]:
    """Owner markers listed in the registry (validators of the attacker's own node are off)."""
    from decentrain.algorithms.sapo.dht_guard import owner_of, registry_key

    found = await node.get(registry_key(prefix), latest=True)
    if found is None or not isinstance(found.value, dict):
        return []
    return [owner_of(k) for k in found.value if isinstance(k, bytes) and owner_of(k)]


async def _targets(node, prefix: str) -> list[tuple[str, bytes | None]]:
    """(key, that key's victim marker or None)."""
    from decentrain.algorithms.sapo.dht_guard import registry_key, rollouts_key

    victims = await _victims(node, prefix)
    return [
        (f"{prefix}/rollouts", None),
        (registry_key(prefix), None),
        *((rollouts_key(prefix, m), m) for m in victims),
    ]


async def big_records(dht, node, prefix: str) -> int:
    """> 4 MiB of records: five 900 KB records under each key."""
    n = 0
    for key, _ in await _targets(node, prefix):
        for i in range(5):
            await node.store(key, {"round": 1, "payload": os.urandom(900_000)}, _now() + 100, subkey=f"big{i}")
            n += 1
    return n


async def far_future_ttl(dht, node, prefix: str) -> int:
    """Unsigned records under each victim's own subkeys, expiring in ~30 years."""
    from decentrain.algorithms.sapo.dht_guard import chunk_subkey, registry_key

    n = 0
    junk = {"round": 10**6, "n": 1, "payload": b"junk"}
    for key, marker in await _targets(node, prefix):
        for subkey in [chunk_subkey(marker, 0), chunk_subkey(marker, 1)] if marker else ["b", "node0", "node1"]:
            await node.store(key, junk, _now() + FAR_S, subkey=subkey)
            n += 1
        if marker:
            await node.store(registry_key(prefix), 1, _now() + FAR_S, subkey=marker)
            n += 1
    return n


async def whole_key(dht, node, prefix: str) -> int:
    """One 1 MB plain value over each whole key, expiring in ~30 years."""
    targets = await _targets(node, prefix)
    for key, _ in targets:
        await node.store(key, os.urandom(1_000_000), _now() + FAR_S)
    return len(targets)


async def flood(dht, node, prefix: str, count: int = 1000) -> int:
    """`count` junk records under the old key and the registry."""
    n = 0
    for key, _ in (await _targets(node, prefix))[:2]:
        keys = [key] * count
        subkeys = [f"f{i}" for i in range(count)]
        values = [{"round": 1, "n": 1, "payload": b"j" * 200}] * count
        await node.store_many(keys, values, _now() + 100, subkeys=subkeys)
        n += count
    return n


_CAPTURED: list[dict] = []  # lives in the attacker's DHT process: captured values never cross the pipe


async def capture(dht, node, prefix: str) -> int:
    """Every listed node's current records (old key and own keys), kept for `replay`."""
    from decentrain.algorithms.sapo.dht_guard import rollouts_key

    keys = [f"{prefix}/rollouts", *(rollouts_key(prefix, m) for m in await _victims(node, prefix))]
    for key in keys:
        found = await node.get(key, latest=True)
        if found is not None and isinstance(found.value, dict):
            _CAPTURED.extend(v.value for v in found.value.values() if isinstance(v.value, dict))
    return len(_CAPTURED)


async def replay(dht, node, prefix: str) -> int:
    """Captured records again as round 0: under the old key (fresh subkeys) and, when the
    attacker signs like a member, under its own key, where they pass every signature check."""
    from decentrain.algorithms.sapo.dht_guard import chunk_subkey, registry_key, rollouts_key

    marker = next(
        (getattr(v, "local_public_key", None) for v in getattr(node.protocol.record_validator, "_validators", [])), None
    )
    n = 0
    for i, value in enumerate(_CAPTURED):
        await node.store(
            f"{prefix}/rollouts", {"round": 0, "payload": value.get("payload")}, _now() + 100, subkey=f"replay{i}"
        )
        n += 1
        if marker is not None and "n" in value:  # a member replaying under its own signed key
            await node.store(
                rollouts_key(prefix, marker),
                {**value, "round": 0},
                _now() + 100,
                subkey=chunk_subkey(marker, i % int(value["n"])),
            )
            await node.store(registry_key(prefix), 1, _now() + 100, subkey=marker)
            n += 2
    return n


def _signer(node):
    return next(v for v in node.protocol.record_validator._validators if hasattr(v, "local_public_key"))


async def registry_eclipse(dht, node, prefix: str, count: int = 40, size: int = 700_000) -> int:
    """One key, `count` registry subkeys of ~`size` bytes each, every one carrying (and signed for) its marker."""
    from decentrain.algorithms.sapo.dht_guard import registry_key

    marker = _signer(node).local_public_key
    for i in range(count):
        await node.store(
            registry_key(prefix),
            1,
            _now() + 100,
            subkey=os.urandom(size // 2).hex()[:size].encode() + b"%d" % i + marker,
        )
    return count


async def sybil_crowding(dht, node, prefix: str, keys: int = 32, chunks: int = 43) -> int:
    """`keys` fresh RSA identities, each listed in the registry with a ~`chunks` x 12 KiB record
    (valid shape and signatures, junk payload): together over `max_peers_per_round` and `max_fetch_bytes`.
    The attacker's one signer is re-keyed for each identity (hivemind keeps one per DHT)."""
    from hivemind.utils.crypto import RSAPrivateKey

    from decentrain.algorithms.sapo.dht_guard import CHUNK_BYTES, chunk_subkey, registry_key, rollouts_key

    signer = _signer(node)
    if not hasattr(signer, "_sybils"):
        signer._sybils = [RSAPrivateKey() for _ in range(keys)]
    own = (signer._private_key, signer._local_public_key)
    n = 0
    round_ = int(_now())
    try:
        for key in signer._sybils:
            signer._private_key = key
            signer._local_public_key = b"[owner:" + key.get_public_key().to_bytes() + b"]"
            marker = signer._local_public_key
            for i in reversed(range(chunks)):
                await node.store(
                    rollouts_key(prefix, marker),
                    {"round": round_, "n": chunks, "payload": os.urandom(CHUNK_BYTES)},
                    _now() + 60,
                    subkey=chunk_subkey(marker, i),
                )
            await node.store(registry_key(prefix), 1, _now() + 60, subkey=marker)
            n += chunks + 1
    finally:
        signer._private_key, signer._local_public_key = own
    return n


async def registry_poison(dht, node, prefix: str) -> int:
    """The signed 1-byte value b"\\xc1" (not msgpack) under the attacker's own registry subkey,
    sent raw to every peer it knows and kept in its own storage: it passes the signature check,
    and hivemind cannot deserialize it when a registry lookup ends."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    from decentrain.algorithms.sapo.dht_guard import registry_key

    proto = node.protocol
    key_id, marker, expiration = (
        DHTID.generate(source=registry_key(prefix)),
        _signer(node).local_public_key,
        _now() + 100,
    )
    record = DHTRecord(key_id.to_bytes(), proto.serializer.dumps(marker), b"\xc1", expiration)
    signed = proto.record_validator.sign_value(record)
    proto.storage.store_subkey(key_id, marker, signed, expiration)  # answers every find from here too
    n = 1
    for _, peer_id in proto.routing_table.get_nearest_neighbors(key_id, proto.bucket_size, exclude=node.node_id):
        await proto.call_store(peer_id, keys=[key_id], values=[signed], expiration_time=[expiration], subkeys=[marker])
        n += 1
    return n


_SLOW: dict = {"calls": None}  # in the attacker's DHT process: callers of its slowed handlers


async def slow_responder(dht, node, prefix: str, delay_s: float = 2.5) -> int:
    """Answer every find and store only after `delay_s` (2.5 s: under hivemind's default 3 s
    per-call limit, so never banned by it), as any member can; counts calls per caller. Once."""
    import asyncio
    from collections import Counter

    from hivemind.utils.auth import AuthRole, AuthRPCWrapper

    if _SLOW["calls"] is not None:
        return 0
    proto, calls = node.protocol, Counter()
    _SLOW["calls"] = calls
    await proto.remove_p2p_handlers(proto.p2p)

    def slowed(handler):
        async def answer(request, context):
            calls[context.remote_id.to_base58()] += 1
            await asyncio.sleep(delay_s)
            return await handler(request, context)

        return answer

    proto.rpc_find, proto.rpc_store = slowed(proto.rpc_find), slowed(proto.rpc_store)
    await proto.add_p2p_handlers(proto.p2p, AuthRPCWrapper(proto, AuthRole.SERVICER, proto.authorizer))
    return 1


async def slow_calls(dht, node) -> dict[str, int]:
    """Finds and stores the slow responder received so far, by caller (base58 peer id)."""
    return dict(_SLOW["calls"] or {})


_SYBIL_KEYS: dict = {}  # in the attacker's DHT process: Sybil index -> its RSA key, made once


async def publish_as(dht, node, prefix: str, index: int, round_: int, data: bytes) -> int:
    """Store compressed payload `data` as round `round_` of Sybil `index` (its own RSA identity,
    re-keying the attacker's one signer as `sybil_crowding` does): chunks, then its registry entry.
    Valid in every respect a DHT can check; `data` stays under the command pipe's 16 KiB."""
    from hivemind.utils.crypto import RSAPrivateKey

    from decentrain.algorithms.sapo.dht_guard import CHUNK_BYTES, chunk_subkey, registry_key, rollouts_key

    signer = _signer(node)
    key = _SYBIL_KEYS.setdefault(index, RSAPrivateKey())
    own = (signer._private_key, signer._local_public_key)
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    try:
        signer._private_key = key
        signer._local_public_key = marker = b"[owner:" + key.get_public_key().to_bytes() + b"]"
        for i in reversed(range(len(chunks))):
            await node.store(
                rollouts_key(prefix, marker),
                {"round": round_, "n": len(chunks), "payload": chunks[i]},
                _now() + 60,
                subkey=chunk_subkey(marker, i),
            )
        await node.store(registry_key(prefix), 1, _now() + 60, subkey=marker)
    finally:
        signer._private_key, signer._local_public_key = own
    return len(chunks) + 1


SHAPES = {
    "big_records": big_records,
    "far_future_ttl": far_future_ttl,
    "whole_key": whole_key,
    "flood_1000": flood,
    "registry_eclipse": registry_eclipse,
    "sybil_crowding": sybil_crowding,
    "registry_poison": registry_poison,
    "slow_responder": slow_responder,
}


def attacker_dht(initial_peers: list[str]):
    """A raw hivemind DHT on loopback with its own RSA identity, like any swarm member. It runs
    only hivemind's signature validator (to read signed values), none of a SAPO node's rules,
    and stores unsigned records wherever it likes."""
    import hivemind
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.utils.crypto import RSAPrivateKey

    return hivemind.DHT(
        initial_peers=initial_peers,
        start=True,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        nat_port_map=False,
        use_relay=False,
        use_auto_relay=False,
        auto_nat=False,
        record_validators=[RSASignatureValidator(RSAPrivateKey())],
    )


def _run(attacker, fn, timeout: float) -> int:
    return attacker.run_coroutine(fn, return_future=True).result(timeout=timeout)


def run_shape(attacker, name: str, prefix: str, timeout: float = 120, **shape_kw) -> int:
    return _run(attacker, partial(SHAPES[name], prefix=prefix, **shape_kw), timeout)


def run_publish_as(attacker, prefix: str, index: int, round_: int, data: bytes, timeout: float = 60) -> int:
    return _run(attacker, partial(publish_as, prefix=prefix, index=index, round_=round_, data=data), timeout)


def run_slow_calls(attacker, timeout: float = 60) -> dict[str, int]:
    return _run(attacker, slow_calls, timeout)


def run_capture(attacker, prefix: str, timeout: float = 60) -> int:
    return _run(attacker, partial(capture, prefix=prefix), timeout)


def run_replay(attacker, prefix: str, timeout: float = 60) -> int:
    return _run(attacker, partial(replay, prefix=prefix), timeout)
