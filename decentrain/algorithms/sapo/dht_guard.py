"""What a SAPO node lets into, and takes out of, a hivemind DHT shared with strangers.

Layout (one swarm = one `prefix`):

    <prefix>/nodes                      registry: subkey = a node's owner marker, value = 1
    <prefix>/rollouts/<sha256(key)[:32]>  that node's latest payload, zlib-compressed and cut in
                                        chunks: subkey = marker + b"#<i>", value =
                                        {"round": int, "n": chunks, "payload": chunk i}

Chunks, because hivemind's DHT process reads its command pipe without blocking, and Python's
multiprocessing writes a message over 16 KiB in two parts: a store of ~32 KiB or more from the
training process can kill the DHT process (`BlockingIOError`, then `EOFError`). Chunks are
`CHUNK_BYTES` and stored one after another.

An owner marker is hivemind's `[owner:<RSA public key>]`: hivemind's RSASignatureValidator then
refuses any write under that subkey not signed by the key's holder. `SwarmRecordValidator` runs
after it, on every record this node stores for others or receives from them, and refuses
  - a record without exactly one owner marker in its subkey (a plain value over a whole key,
    which blocked every write on the old single key, or anyone's unsigned subkey);
  - a record whose key is neither the registry nor the rollouts key derived from that very
    marker (so one node's key holds one node's record: nobody can crowd or block another's);
  - an expiration beyond now + max_ttl_s (a far-future TTL pinned a record for good);
  - a value over its size cap (registry: tiny; rollouts: below the 2 MiB unary message limit
    of hivemind's p2p daemon, whose overflow made peers drop each other from routing tables);
  - a subkey longer than its marker (+ `#<chunk>` for rollouts) or a marker over
    `MAX_MARKER_BYTES` (hivemind's RSA-2048 marker is 388 bytes): 40 registry subkeys of
    ~700 KB each from one key once kept an honest sender's records from every receiver;
  - a subkey or value that does not decode to exactly what an honest node writes (the
    registry's integer 1; a chunk's {"round", "n", "payload"} with its index below n): hivemind
    validates bytes and deserializes them only when a lookup ends, so the signed 1-byte value
    b"\xc1" (not msgpack) once made every registry lookup die inside the DHT process and the
    node wait `rpc_timeout_s` for it, every round.
The validator runs at store time (a peer's store to us), and on every answer to our lookups.

Slow replicas (`guard_slow_peers`, installed in the DHT process): a peer whose find or store
answer takes longer than `slow_rpc_s` is cut off at that time and charged in hivemind's own
blacklist, which lookups and store traversals then skip for `slow_ban_s`, doubling at each
new charge. A member answering just under hivemind's per-call limit once turned each honest
exchange from 0.05 s into 10 s.

Hand-written because hivemind ships only the signature check and a pydantic schema validator,
and neither can tie a key to its owner or cap sizes and TTLs.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import zlib
from collections import Counter

import msgpack
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import get_dht_time

_OWNER_RE = re.compile(rb"\[owner:(.+?)\]")
_CHUNK_RE = re.compile(rb"\]#(\d{1,5})$")
TTL_SLACK_S = 5.0  # clock skew between honest peers
CHUNK_BYTES = 12 << 10  # one pipe message stays below 16 KiB (see above)
CHUNK_OVERHEAD = 256  # msgpack of {"round", "n", "payload"} around a chunk
MAX_MARKER_BYTES = 1024  # an RSA public key as hivemind writes it, with room for 4096-bit keys
_MSGPACK_BIN_HEADER = 5  # the most msgpack adds in front of a serialized bytes subkey


def chunk_subkey(marker: bytes, index: int) -> bytes:
    return marker + b"#%d" % index


def max_chunks(max_record_bytes: int) -> int:
    return -(-max_record_bytes // CHUNK_BYTES)


REGISTRY_VALUE = msgpack.packb(1)  # the registry value, serialized as hivemind does


def decode_value(data: bytes):
    """msgpack `data` as hivemind will read it (raw=False, str/bytes map keys), or None: never raises.

    Extension types stay `msgpack.ExtType` here (no hook runs) and fail every shape check below.
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception:  # any malformed, truncated or trailing input: msgpack raises several types
        return None


def chunk_value_ok(value, index: int, max_record_bytes: int) -> bool:
    """A rollouts chunk as `HivemindExchange._publish` writes it, and chunk `index` of it."""
    if not isinstance(value, dict) or set(value) != {"round", "n", "payload"}:
        return False
    round_, n, payload = value["round"], value["n"], value["payload"]
    if any(type(v) is not int for v in (round_, n)):  # bool is an int subclass: refused too
        return False
    return (
        round_ >= 0
        and index < n <= max_chunks(max_record_bytes)
        and type(payload) is bytes
        and len(payload) <= CHUNK_BYTES
    )


def registry_key(prefix: str) -> str:
    return f"{prefix}/nodes"


def owner_digest(marker: bytes) -> str:
    """A short, log-safe name for a peer's public key."""
    return hashlib.sha256(marker).hexdigest()[:32]


def rollouts_key(prefix: str, marker: bytes) -> str:
    return f"{prefix}/rollouts/{owner_digest(marker)}"


def owner_of(subkey: bytes) -> bytes | None:
    """The single `[owner:...]` marker in a (serialized) subkey, or None."""
    found = _OWNER_RE.findall(subkey or b"")
    return b"[owner:" + found[0] + b"]" if len(found) == 1 else None


class SwarmRecordValidator(RecordValidatorBase):
    def __init__(self, prefix: str, max_ttl_s: float, max_record_bytes: int):
        self.prefix, self.max_ttl_s, self.max_record_bytes = prefix, max_ttl_s, max_record_bytes
        self.registry_id = DHTID.generate(source=registry_key(prefix)).to_bytes()

    def validate(self, record: DHTRecord) -> bool:
        if len(record.subkey) > MAX_MARKER_BYTES + _MSGPACK_BIN_HEADER + 6:  # before any regex
            return False
        marker = owner_of(record.subkey)
        if marker is None or len(marker) > MAX_MARKER_BYTES:
            return False
        if record.expiration_time > get_dht_time() + self.max_ttl_s + TTL_SLACK_S:
            return False
        subkey = decode_value(record.subkey)
        if type(subkey) is not bytes:
            return False
        if record.key == self.registry_id:
            return subkey == marker and record.value == REGISTRY_VALUE
        if record.key != DHTID.generate(source=rollouts_key(self.prefix, marker)).to_bytes():
            return False
        index = _CHUNK_RE.search(subkey)
        if index is None or subkey != chunk_subkey(marker, int(index.group(1))):
            return False
        if len(record.value) > CHUNK_BYTES + CHUNK_OVERHEAD:  # before decoding it
            return False
        return chunk_value_ok(decode_value(record.value), int(index.group(1)), self.max_record_bytes)

    @property
    def priority(self) -> int:
        return 0  # after RSASignatureValidator (10): sees the value with its signature stripped


_SLOW_CHARGES: Counter = Counter()  # in the DHT process: peer id -> times charged as slow


async def guard_slow_peers(dht, node, slow_rpc_s: float) -> None:
    """Run once inside the DHT process (`DHT.run_coroutine`): cut finds and stores at `slow_rpc_s`.

    hivemind blacklists a peer only when a find times out at its per-call `wait_timeout`, and
    never for a slow store, so a member answering just under that limit is waited on by every
    lookup and every store traversal. Here a find or store that takes longer than `slow_rpc_s`
    is abandoned and the peer charged (`Blacklist.register_failure`: skipped for the ban time,
    doubled per charge); stores skip blacklisted peers as finds already do.
    """
    find, store = node._call_find_with_blacklist, node.protocol.call_store

    async def timed(call, peer_id, *args, **kwargs):
        try:
            return await asyncio.wait_for(call(peer_id, *args, **kwargs), slow_rpc_s)
        except asyncio.TimeoutError:
            _SLOW_CHARGES[peer_id.to_base58()] += 1
            node.blacklist.register_failure(peer_id)
            return None

    async def guarded_store(peer_id, *args, **kwargs):
        if peer_id in node.blacklist:
            return None  # as a failed store: the traversal moves on to the next replica
        return await timed(store, peer_id, *args, **kwargs)

    node._call_find_with_blacklist = lambda peer_id, keys: timed(find, peer_id, keys)
    node.protocol.call_store = guarded_store


async def slow_charges(dht, node) -> dict[str, int]:
    """Peers charged as slow so far (base58 peer id -> count), read from the DHT process."""
    return dict(_SLOW_CHARGES)


def compress(payload: bytes) -> bytes:
    return zlib.compress(payload, 6)


def inflate(data: bytes, max_bytes: int) -> bytes | None:
    """zlib-inflate at most `max_bytes`; None for a bomb (more output) or broken/trailing data.

    The cap is applied while inflating (`max_length`), so a 1 KiB bomb never expands in memory.
    """
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error:
        return None
    if len(out) > max_bytes or d.unconsumed_tail or d.unused_data or not d.eof:
        return None
    return out
