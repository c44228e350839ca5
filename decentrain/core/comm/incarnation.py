"""Heal authority: only a launcher can say which incarnation of a rank it started, and only that
incarnation can ask a donor for its state.

A donor hands its whole training state to whoever asks as a replacement, so "who is a
replacement" must come from the launchers, and a request must prove it comes from the worker
the launcher started, not from anything a store client can read or write.

- Every launcher of a job holds the job secret (`DECENTRAIN_JOB_SECRET`, the same on every host;
  a one-host launcher makes one up). From it they derive one Ed25519 key pair. The private key
  never leaves the launchers: not through the store, not into a worker's environment.
- Starting incarnation i of rank r, a launcher makes the worker a key pair of its own and signs
  (job, r, i, the worker's public key): the certificate. The store record `<INCARNATION_KEY>/r/i`
  gets the public key and the certificate (public, nothing in it opens a heal); the worker's
  environment gets its private key and the certificate (`DECENTRAIN_INCARNATION_TOKEN`).
- A heal request carries the certificate and the requester's signature of (job, donor, the
  donor's current nonce, r, i). A donor serves it only if both signatures hold, the nonce is one
  it issued and has not granted for that incarnation yet, and no later incarnation of r was
  started (a validly signed record above i).

So a store client that copies everything in the store can neither ask as a replacement (it lacks
the worker's private key) nor replay a request (the donor's nonce moved on), and the real
replacement, whose attempt failed, asks again with the new nonce and is served.

Departure from "an HMAC with a per-job secret": signatures, because a donor must check requests
and an HMAC key that checks can also forge; with per-incarnation keys a worker can speak only
for itself, even to a donor.

It lives in core/comm beside the membership that checks heal requests: the launcher (core/launch)
imports it, and core/comm imports nothing of core/launch (tests/unit/test_layering.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import Mapping

import torch.distributed as dist
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from decentrain.core.identity import NodeIdentity, is_public_key_hex, verify_signature
from decentrain.core.shared_store import MAX_COUNT, parse_count, peek

log = logging.getLogger(__name__)

SECRET_ENV = "DECENTRAIN_JOB_SECRET"  # launchers only (every host of a job: the same value)
PUBLIC_KEY_ENV = "DECENTRAIN_LAUNCHER_KEY"  # workers: the launchers' public key, hex
TOKEN_ENV = "DECENTRAIN_INCARNATION_TOKEN"  # workers: "<own private key>,<launcher's certificate>", hex
JOB_ENV = "TORCHELASTIC_RUN_ID"  # the job id every rank of one job shares (set by the launcher)
# `<INCARNATION_KEY>/<rank>/<incarnation>`: "<worker public key>,<certificate>", written by the launcher
# that started that incarnation (compare_set: a launcher's record is never replaced)
INCARNATION_KEY = "launcher/incarnation"
_SCAN = 64  # records read past the newest valid one for a later one (numbers a store client filled with garbage)
_CLAIM_TRIES = 1024  # compare_sets one claim may lose to store clients rewriting records before it gives up
_SIG_HEX, _KEY_HEX, NONCE_HEX = 128, 64, 32
MAX_REQUEST_BYTES = 512  # a heal request is ~370 bytes; longer values are cut before parsing
_HEX = frozenset("0123456789abcdef")


def _record_message(job: str, rank: int, incarnation: int, worker_key: str) -> bytes:
    return f"decentrain-incarnation\x00{job}\x00{rank}\x00{incarnation}\x00{worker_key}".encode()


def _request_message(job: str, donor: int, nonce: str, rank: int, incarnation: int) -> bytes:
    return f"decentrain-heal\x00{job}\x00{donor}\x00{nonce}\x00{rank}\x00{incarnation}".encode()


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and set(text) <= _HEX


def _split_record(raw: bytes | str | None) -> tuple[str, str] | None:
    """(worker public key, certificate) of a record's text; None unless both are well-formed hex."""
    if not isinstance(raw, (bytes, str)) or len(raw) != _KEY_HEX + 1 + _SIG_HEX:
        return None
    try:
        text = raw.decode("ascii") if isinstance(raw, bytes) else raw
        pub, cert = text.split(",")
    except (UnicodeDecodeError, ValueError):
        return None
    return (pub, cert) if is_public_key_hex(pub) and _is_hex(cert, _SIG_HEX) else None


class LauncherKey:
    """The launchers' signing key for one job (derived from the job secret)."""

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError(f"{SECRET_ENV} must hold at least 16 bytes of secret (got {len(secret)})")
        self._id = NodeIdentity(
            Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"decentrain-launcher\x00" + secret).digest())
        )
        self._next: dict[int, int] = {}  # rank -> the incarnation after the last one this launcher claimed

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, *, required: bool = False) -> "LauncherKey":
        """The job's key from `DECENTRAIN_JOB_SECRET`; without it, a fresh one (one host) or ValueError (`required`)."""
        secret = env.get(SECRET_ENV, "")
        if not secret:
            if required:
                raise ValueError(
                    f"{SECRET_ENV} is unset: every host's launcher of a multi-host job needs the same "
                    "secret (e.g. `export DECENTRAIN_JOB_SECRET=$(openssl rand -hex 32)`, passed to each host)"
                )
            return cls(secrets.token_bytes(32))
        return cls(secret.encode())

    @property
    def public_hex(self) -> str:
        return self._id.node_id

    def certify(self, job: str, rank: int, incarnation: int, worker_key: str) -> str:
        """The launchers' signature of (job, rank, incarnation, the worker's public key)."""
        return self._id.sign(_record_message(job, rank, incarnation, worker_key)).decode("ascii")

    def claim(self, store: dist.Store, job: str, rank: int) -> tuple[int, str]:
        """Take the next incarnation of `rank` in `store`: (incarnation, the worker's token for `worker_env`).

        The lowest number whose record holds no launcher's signature is taken with compare_set, so
        two launchers never take one number, and what store clients wrote there (a pre-written or
        overwritten record, any value of the old `next` counter) neither blocks nor moves a claim:
        a record no launcher signed is replaced. Raises RuntimeError (the store is gone, or clients
        rewrite records faster than this launcher can claim one).
        """
        worker = Ed25519PrivateKey.generate()  # the worker's own key: its heal requests are its alone
        worker_hex = worker.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        ).hex()
        worker_pub = NodeIdentity(worker).node_id
        check = IncarnationCheck(job, self.public_hex)
        incarnation = self._next.get(rank, 0)
        seen = peek(store, f"{INCARNATION_KEY}/{rank}/{incarnation}")
        for _ in range(_CLAIM_TRIES):
            key = f"{INCARNATION_KEY}/{rank}/{incarnation}"
            if seen is not None and check.record_key(rank, incarnation, seen) is not None:
                incarnation += 1  # a launcher started this one
                seen = peek(store, f"{INCARNATION_KEY}/{rank}/{incarnation}")
                continue
            cert = self.certify(job, rank, incarnation, worker_pub)
            record = f"{worker_pub},{cert}"
            expected = b"" if seen is None else seen
            got = store.compare_set(key, expected, record)
            if got == record.encode():
                if seen is not None:
                    log.warning(
                        "rank %d: incarnation %d's record held a value no launcher signed; replaced it",
                        rank,
                        incarnation,
                    )
                self._next[rank] = incarnation + 1
                return incarnation, f"{worker_hex},{cert}"
            # someone wrote the record meanwhile: compare_set answered what is there now (or, for a key
            # deleted meanwhile, the expected value itself)
            seen = None if got == expected else got
        raise RuntimeError(
            f"rank {rank}: no incarnation record claimed in {_CLAIM_TRIES} tries (store clients keep rewriting them)"
        )

    def worker_env(self, job: str, token: str) -> dict[str, str]:
        """What a worker gets: the public key and its own token, never the secret."""
        return {PUBLIC_KEY_ENV: self.public_hex, TOKEN_ENV: token, JOB_ENV: job}


@dataclass(frozen=True)
class IncarnationCheck:
    """A worker's side: its own token (to ask for a heal), and checks of others' records and requests."""

    job: str
    public_hex: str  # the launchers' Ed25519 public key
    token: str = field(default="", repr=False)  # "<own private key>,<certificate>" (hex); "" for none

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "IncarnationCheck | None":
        """None when no launcher key was given (then no heal request is honoured)."""
        public = env.get(PUBLIC_KEY_ENV, "")
        if not public:
            return None
        if not is_public_key_hex(public):
            log.warning("%s is not a hex Ed25519 public key: no heal request will be honoured", PUBLIC_KEY_ENV)
            return None
        return cls(env.get(JOB_ENV, ""), public, env.get(TOKEN_ENV, ""))

    def record_key(self, rank: int, incarnation: int, raw: bytes | str | None) -> str | None:
        """The worker public key in a record the launchers signed for this rank's incarnation; None otherwise."""
        parts = _split_record(raw)
        if parts is None:
            return None
        pub, cert = parts
        ok = verify_signature(self.public_hex, cert.encode("ascii"), _record_message(self.job, rank, incarnation, pub))
        return pub if ok else None

    def heal_request(self, donor: int, nonce: str, rank: int, incarnation: int) -> str | None:
        """This worker's request to `donor`, signed over the donor's `nonce`; None without a usable token."""
        try:
            private, cert = self.token.split(",")
            key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(private))
        except ValueError:
            return None
        ident = NodeIdentity(key)
        signature = ident.sign(_request_message(self.job, donor, nonce, rank, incarnation)).decode("ascii")
        return f"{incarnation},{nonce},{ident.node_id},{cert},{signature}"

    def read_request(self, raw: bytes, donor: int, rank: int) -> tuple[int, str] | None:
        """(incarnation, nonce) of a heal request from `rank` to `donor` whose certificate and signature
        hold; None for anything else (never raises)."""
        try:
            inc_s, nonce, pub, cert, signature = raw[:MAX_REQUEST_BYTES].decode("ascii").split(",")
        except (AttributeError, TypeError, UnicodeDecodeError, ValueError):
            return None
        inc = parse_count(inc_s.encode("ascii"))
        if inc is None or not (0 < inc < MAX_COUNT and _is_hex(nonce, NONCE_HEX) and _is_hex(signature, _SIG_HEX)):
            return None
        if self.record_key(rank, inc, f"{pub},{cert}") != pub:
            return None  # no launcher started this incarnation with this key
        if not verify_signature(pub, signature.encode("ascii"), _request_message(self.job, donor, nonce, rank, inc)):
            return None
        return inc, nonce

    def newest(self, store: dist.Store, rank: int, known: int = -1) -> int:
        """The latest incarnation of `rank` a launcher started, at or above `known` (-1: none known yet).

        What a store client writes cannot change the answer: an overwritten or pre-written record
        holds no valid signature, so it neither supersedes an incarnation nor vouches for one.
        """
        newest, probe = known, known + 1
        while probe <= newest + _SCAN:  # past up to _SCAN numbers a store client filled with garbage
            try:
                record = peek(store, f"{INCARNATION_KEY}/{rank}/{probe}")
            except (RuntimeError, OSError, ValueError):  # the store is gone: nothing more is started
                break
            if record is None:
                break
            if self.record_key(rank, probe, record) is not None:
                newest = probe
            probe += 1
        return newest

    def superseded(self, store: dist.Store, rank: int, incarnation: int) -> bool:
        """A launcher started a later incarnation of `rank` (this one is dead or about to be)."""
        return self.newest(store, rank, incarnation) > incarnation
