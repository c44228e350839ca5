"""Heal authority: only a launcher can say which incarnation of a rank it started.

A donor hands its whole training state to whoever asks as a replacement, so "who is a
replacement" must come from the launchers, not from anything a store client can write.

- Every launcher of a job holds the job secret (`DECENTRAIN_JOB_SECRET`, the same on every host;
  a one-host launcher makes one up). From it they derive one Ed25519 key pair. The private key
  never leaves the launchers: not through the store, not into a worker's environment.
- Starting incarnation i of rank r, a launcher claims the store record `<INCARNATION_KEY>/r/i`
  with compare_set (set once: whoever writes it first owns it, no later write replaces it) and
  puts there, and into that worker's environment, its signature of (job, r, i).
- Workers get the public key by environment. A heal request carries the requester's token; a
  donor serves it only if the signature holds, no later incarnation of the rank was started
  (a validly signed record above it), and it has not served that incarnation before.

Departure from "an HMAC with a per-job secret": a signature, because a donor must check tokens
and an HMAC key that checks can also forge; with Ed25519 a worker's store client cannot mint a
token even when the worker process is its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass
from typing import Mapping

import torch.distributed as dist
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from decentrain.core.identity import NodeIdentity, is_public_key_hex, verify_signature

log = logging.getLogger(__name__)

SECRET_ENV = "DECENTRAIN_JOB_SECRET"  # launchers only (every host of a job: the same value)
PUBLIC_KEY_ENV = "DECENTRAIN_LAUNCHER_KEY"  # workers: the launchers' public key, hex
TOKEN_ENV = "DECENTRAIN_INCARNATION_TOKEN"  # workers: the launcher's signature of (job, rank, incarnation)
JOB_ENV = "TORCHELASTIC_RUN_ID"  # the job id every rank of one job shares (set by the launcher)
# `<INCARNATION_KEY>/<rank>/<incarnation>`: the token of that incarnation, written once by the
# launcher that started it; `<INCARNATION_KEY>/<rank>/next` counts the incarnations handed out.
INCARNATION_KEY = "launcher/incarnation"
_MAX_CLAIMS = 64  # records a store client pre-wrote to block a claim: skipped, up to this many
_SIG_HEX = 128


def _message(job: str, rank: int, incarnation: int) -> bytes:
    return f"decentrain-incarnation\x00{job}\x00{rank}\x00{incarnation}".encode()


class LauncherKey:
    """The launchers' signing key for one job (derived from the job secret)."""

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError(f"{SECRET_ENV} must hold at least 16 bytes of secret (got {len(secret)})")
        self._id = NodeIdentity(Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"decentrain-launcher\x00" + secret).digest()))

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, *, required: bool = False) -> "LauncherKey":
        """The job's key from `DECENTRAIN_JOB_SECRET`; without it, a fresh one (one host) or ValueError (`required`)."""
        secret = env.get(SECRET_ENV, "")
        if not secret:
            if required:
                raise ValueError(f"{SECRET_ENV} is unset: every host's launcher of a multi-host job needs the same "
                                 "secret (e.g. `export DECENTRAIN_JOB_SECRET=$(openssl rand -hex 32)`, passed to each host)")
            return cls(secrets.token_bytes(32))
        return cls(secret.encode())

    @property
    def public_hex(self) -> str:
        return self._id.node_id

    def sign(self, job: str, rank: int, incarnation: int) -> str:
        return self._id.sign(_message(job, rank, incarnation)).decode("ascii")

    def claim(self, store: dist.Store, job: str, rank: int) -> tuple[int, str]:
        """Take the next incarnation of `rank` in `store`: (incarnation, its token).

        The counter gives each launcher a different number; the set-once record makes it
        this launcher's (a number whose record someone already wrote is skipped).
        """
        for _ in range(_MAX_CLAIMS):
            incarnation = store.add(f"{INCARNATION_KEY}/{rank}/next", 1) - 1
            token = self.sign(job, rank, incarnation)
            if store.compare_set(f"{INCARNATION_KEY}/{rank}/{incarnation}", "", token) == token.encode():
                return incarnation, token
            log.warning("rank %d: incarnation %d's record was written by someone else; taking the next", rank, incarnation)
        raise RuntimeError(f"rank {rank}: {_MAX_CLAIMS} incarnation records in a row were taken by store clients")

    def worker_env(self, job: str, token: str) -> dict[str, str]:
        """What a worker gets: the public key and its own token, never the secret."""
        return {PUBLIC_KEY_ENV: self.public_hex, TOKEN_ENV: token, JOB_ENV: job}


@dataclass(frozen=True)
class IncarnationCheck:
    """A worker's side: its own token, and a check of others' against the launchers' public key."""

    job: str
    public_hex: str  # the launchers' Ed25519 public key
    token: str = ""

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

    def signed(self, rank: int, incarnation: int, token: str) -> bool:
        """True iff `token` is the launchers' signature of this rank's incarnation; never raises."""
        if not (isinstance(token, str) and len(token) == _SIG_HEX and token.isascii()):
            return False
        return verify_signature(self.public_hex, token.encode("ascii"), _message(self.job, rank, incarnation))

    def started(self, store: dist.Store, rank: int, incarnation: int, token: str) -> bool:
        """Signed for this rank's incarnation, and no later incarnation of it was started."""
        return self.signed(rank, incarnation, token) and not self.superseded(store, rank, incarnation)

    def superseded(self, store: dist.Store, rank: int, incarnation: int) -> bool:
        """A launcher started a later incarnation of `rank` (this one is dead or about to be).

        What a store client writes cannot change the answer: an overwritten or pre-written record
        holds no valid signature, so it neither supersedes an incarnation nor vouches for one.
        """
        for later in range(incarnation + 1, incarnation + 1 + _MAX_CLAIMS):  # numbers a claim skipped hold garbage
            record = _record(store, rank, later)
            if record is None:
                return False
            if self.signed(rank, later, record):
                return True
        return False


def _record(store: dist.Store, rank: int, incarnation: int) -> str | None:
    key = f"{INCARNATION_KEY}/{rank}/{incarnation}"
    try:
        return store.get(key).decode("ascii", "replace") if store.check([key]) else None
    except (RuntimeError, OSError, ValueError):  # the store is gone: nothing is started
        return None
