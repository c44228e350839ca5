"""Node identity: an Ed25519 key per node (via `cryptography`), kept in a key file so a restarted
node keeps its id. The id on the wire is the public key in hex; every payload is signed with it.

Names (the human-readable `node_id` in configs, logs and run dirs) are restricted to a safe
ASCII set, so that no peer-chosen text can hide in a log line (NUL, right-to-left override,
zero-width characters) or escape a directory.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

logger = logging.getLogger(__name__)

PUBLIC_KEY_HEX_LEN = 64  # 32 bytes
SIGNATURE_HEX_LEN = 128  # 64 bytes
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_HEX = re.compile(r"[0-9a-f]+")


def check_node_name(name: object) -> str | None:
    """None if `name` is a safe node name, else why not (one short phrase)."""
    if not isinstance(name, str):
        return f"is {type(name).__name__}, not str"
    if not _NAME.fullmatch(name) or name in (".", ".."):
        return f"{safe_label(name)} must be 1-64 chars of [A-Za-z0-9._-]"
    return None


def safe_label(text: object, limit: int = 48) -> str:
    """Peer-supplied text as it may appear in a log: escaped, printable ASCII, truncated."""
    s = text if isinstance(text, str) else repr(text)
    s = s[:limit].encode("ascii", "backslashreplace").decode("ascii")
    return repr(s) if not s.isprintable() or not s else s


def is_public_key_hex(value: object) -> bool:
    return isinstance(value, str) and len(value) == PUBLIC_KEY_HEX_LEN and bool(_HEX.fullmatch(value))


class NodeIdentity:
    """An Ed25519 key pair; `node_id` is the public key (64 lowercase hex chars)."""

    def __init__(self, private_key: Ed25519PrivateKey):
        self._key = private_key
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.node_id = raw.hex()

    @classmethod
    def generate(cls) -> NodeIdentity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | Path) -> NodeIdentity:
        """The key stored at `path` (raw 32 bytes, mode 0600), created there on first use."""
        path = Path(path)
        if path.exists():
            raw = path.read_bytes()
            if len(raw) != 32:
                raise ValueError(f"node key file {path} holds {len(raw)} bytes, expected 32 (raw Ed25519 private key)")
            return cls(Ed25519PrivateKey.from_private_bytes(raw))
        ident = cls.generate()
        raw = ident._key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # atomic: a crash leaves the old state or the whole key
        logger.info("created node key %s (id %s)", path, ident.node_id[:16])
        return ident

    def sign(self, data: bytes) -> bytes:
        """Hex signature (128 ASCII bytes) of `data`."""
        return self._key.sign(data).hex().encode("ascii")


def verify_signature(public_key_hex: str, signature_hex: bytes, data: bytes) -> bool:
    """True iff `signature_hex` is a valid Ed25519 signature of `data`; never raises on bad input."""
    try:
        sig = signature_hex.decode("ascii")
        if not _HEX.fullmatch(sig):  # one spelling per signature: fromhex would also take upper case
            return False
        pub = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))
        pub.verify(bytes.fromhex(sig), data)
        return True
    except (InvalidSignature, ValueError, UnicodeDecodeError):
        return False
