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
    ~700 KB each from one key once kept an honest sender's records from every receiver.

Hand-written because hivemind ships only the signature check and a pydantic schema validator,
and neither can tie a key to its owner or cap sizes and TTLs.
"""

from __future__ import annotations

import hashlib
import re
import zlib

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import get_dht_time

_OWNER_RE = re.compile(rb"\[owner:(.+?)\]")
_CHUNK_RE = re.compile(rb"\]#(\d{1,5})$")
TTL_SLACK_S = 5.0  # clock skew between honest peers
REGISTRY_VALUE_BYTES = 64  # the registry value is the integer 1; anything more is junk
CHUNK_BYTES = 12 << 10  # one pipe message stays below 16 KiB (see above)
CHUNK_OVERHEAD = 256  # msgpack of {"round", "n", "payload"} around a chunk
MAX_MARKER_BYTES = 1024  # an RSA public key as hivemind writes it, with room for 4096-bit keys
_MSGPACK_BIN_HEADER = 5  # the most msgpack adds in front of a serialized bytes subkey


def chunk_subkey(marker: bytes, index: int) -> bytes:
    return marker + b"#%d" % index


def max_chunks(max_record_bytes: int) -> int:
    return -(-max_record_bytes // CHUNK_BYTES)


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
        if record.key == self.registry_id:
            return (len(record.value) <= REGISTRY_VALUE_BYTES and record.subkey.endswith(marker)
                    and len(record.subkey) <= len(marker) + _MSGPACK_BIN_HEADER)
        if record.key != DHTID.generate(source=rollouts_key(self.prefix, marker)).to_bytes():
            return False
        index = _CHUNK_RE.search(record.subkey)
        return (index is not None and int(index.group(1)) < max_chunks(self.max_record_bytes)
                and record.subkey.endswith(chunk_subkey(marker, int(index.group(1))))
                and len(record.subkey) <= len(marker) + _MSGPACK_BIN_HEADER + 6
                and len(record.value) <= CHUNK_BYTES + CHUNK_OVERHEAD)

    @property
    def priority(self) -> int:
        return 0  # after RSASignatureValidator (10): sees the value with its signature stripped


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
