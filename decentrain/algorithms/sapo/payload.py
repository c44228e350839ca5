"""Rollout payloads: the only bytes SAPO nodes exchange. Decoding parses JSON and never unpickles.

Wire format: a one-line ASCII header, then the UTF-8 JSON body.

    DTR1[ <hmac-sha256 hex of body>]\\n{"version":1,"node_id":...,"round":...,"timestamp":...,"groups":[...]}

The signature covers the body bytes exactly as sent, so no canonical re-serialisation is needed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_MAGIC = b"DTR1"
_SIG_HEX_LEN = 64
_PAYLOAD_FIELDS = frozenset({"version", "node_id", "round", "timestamp", "groups"})
_GROUP_FIELDS = frozenset({"question", "answer", "task", "metadata", "completions"})

# Every reason a payload can be dropped for; stable strings, used as metric names.
REJECT_REASONS = (
    "not_bytes",
    "too_large",
    "bad_frame",
    "unsigned",
    "bad_signature",
    "invalid_utf8",
    "bad_json",
    "bad_version",
    "missing_field",
    "unexpected_field",
    "wrong_type",
    "too_many_groups",
    "string_too_long",
    "wrong_num_generations",
    "metadata_too_large",
    "stale_round",
    "future_round",
)


@dataclass(frozen=True)
class RolloutGroup:
    """One question and its G completions, as text: each receiver re-tokenises and re-scores it."""

    question: str
    answer: str
    task: str
    metadata: dict[str, Any]
    completions: tuple[str, ...]


@dataclass(frozen=True)
class RolloutPayload:
    node_id: str
    round: int
    timestamp: float
    groups: tuple[RolloutGroup, ...]
    version: int = SCHEMA_VERSION

    @property
    def key(self) -> tuple[int, str]:
        """Records are keyed by (round, peer): one payload per node per round."""
        return (self.round, self.node_id)


@dataclass
class PayloadLimits:
    num_generations: int = 8  # every group must carry exactly G completions
    max_bytes: int = 1 << 20
    max_groups: int = 64
    max_string_chars: int = 4096  # per question, answer, completion, node id, metadata string
    max_metadata_bytes: int = 4096  # per group, as JSON
    max_metadata_depth: int = 4
    ttl_rounds: int = 2  # accept rounds in [current - ttl, current + ttl]

    def __post_init__(self) -> None:
        for name in ("num_generations", "max_bytes", "max_groups", "max_string_chars", "max_metadata_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.ttl_rounds < 0 or self.max_metadata_depth < 0:
            raise ValueError("ttl_rounds and max_metadata_depth must be >= 0")


@dataclass(frozen=True)
class Rejection:
    reason: str  # one of REJECT_REASONS
    detail: str = ""


class _Reject(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def _as_key(key: bytes | str | None) -> bytes | None:
    return key.encode("utf-8") if isinstance(key, str) else key


def _sign(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode("ascii")


def encode_payload(payload: RolloutPayload, key: bytes | str | None = None) -> bytes:
    obj = {
        "version": payload.version,
        "node_id": payload.node_id,
        "round": payload.round,
        "timestamp": payload.timestamp,
        "groups": [
            {"question": g.question, "answer": g.answer, "task": g.task, "metadata": g.metadata,
             "completions": list(g.completions)}
            for g in payload.groups
        ],
    }
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    key = _as_key(key)
    header = _MAGIC + (b" " + _sign(key, body) if key else b"")
    return header + b"\n" + body


def _check_str(value: Any, what: str, limits: PayloadLimits) -> str:
    if not isinstance(value, str):
        raise _Reject("wrong_type", f"{what} is {type(value).__name__}, not str")
    if len(value) > limits.max_string_chars:
        raise _Reject("string_too_long", f"{what} has {len(value)} chars > {limits.max_string_chars}")
    try:  # JSON escapes can smuggle lone surrogates, which are not UTF-8
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Reject("invalid_utf8", f"{what} has a lone surrogate") from None
    return value


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):  # bool is an int subclass
        raise _Reject("wrong_type", f"{what} is {type(value).__name__}, not int")
    return value


def _check_fields(obj: Any, fields: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _Reject("wrong_type", f"{what} is {type(obj).__name__}, not an object")
    if missing := fields - obj.keys():
        raise _Reject("missing_field", f"{what} lacks {sorted(missing)}")
    if extra := obj.keys() - fields:
        raise _Reject("unexpected_field", f"{what} has {sorted(extra)[:5]}")
    return obj


def _check_json_value(value: Any, what: str, limits: PayloadLimits, depth: int = 0) -> None:
    if depth > limits.max_metadata_depth:
        raise _Reject("metadata_too_large", f"{what} nests deeper than {limits.max_metadata_depth}")
    if isinstance(value, str):
        _check_str(value, what, limits)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_json_value(v, f"{what}.{_check_str(k, what + ' key', limits)[:32]}", limits, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_json_value(v, f"{what}[]", limits, depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise _Reject("wrong_type", f"{what} is not finite")


def _check_group(obj: Any, index: int, limits: PayloadLimits) -> RolloutGroup:
    what = f"groups[{index}]"
    g = _check_fields(obj, _GROUP_FIELDS, what)
    question, answer, task = (_check_str(g[k], f"{what}.{k}", limits) for k in ("question", "answer", "task"))
    if not isinstance(g["metadata"], dict):
        raise _Reject("wrong_type", f"{what}.metadata is not an object")
    _check_json_value(g["metadata"], f"{what}.metadata", limits)
    if len(json.dumps(g["metadata"], ensure_ascii=False).encode("utf-8")) > limits.max_metadata_bytes:
        raise _Reject("metadata_too_large", f"{what}.metadata > {limits.max_metadata_bytes} bytes")
    completions = g["completions"]
    if not isinstance(completions, list):
        raise _Reject("wrong_type", f"{what}.completions is not a list")
    if len(completions) != limits.num_generations:
        raise _Reject("wrong_num_generations", f"{what} has {len(completions)} != {limits.num_generations}")
    completions = tuple(_check_str(c, f"{what}.completions[]", limits) for c in completions)
    return RolloutGroup(question, answer, task, g["metadata"], completions)


def _reject_constant(name: str) -> None:
    raise _Reject("bad_json", f"non-finite constant {name}")


def _decode(data: Any, limits: PayloadLimits, current_round: int, key: bytes | None) -> RolloutPayload:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _Reject("not_bytes", type(data).__name__)
    data = bytes(data)
    if len(data) > limits.max_bytes:
        raise _Reject("too_large", f"{len(data)} bytes > {limits.max_bytes}")

    header, sep, body = data.partition(b"\n")
    sig = header[len(_MAGIC):]
    if not sep or not header.startswith(_MAGIC) or sig and (sig[:1] != b" " or len(sig) != _SIG_HEX_LEN + 1):
        raise _Reject("bad_frame", repr(header[:16]))
    if key is not None:  # without a swarm key, a signature is ignored
        if not sig:
            raise _Reject("unsigned")
        if not hmac.compare_digest(sig[1:], _sign(key, body)):
            raise _Reject("bad_signature")

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Reject("invalid_utf8", str(e)[:80]) from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # RecursionError: deeply nested arrays
        raise _Reject("bad_json", str(e)[:80]) from None

    if isinstance(obj, dict) and "version" in obj and obj["version"] != SCHEMA_VERSION:
        raise _Reject("bad_version", repr(obj["version"])[:16])
    obj = _check_fields(obj, _PAYLOAD_FIELDS, "payload")
    node_id = _check_str(obj["node_id"], "node_id", limits)
    round_ = _check_int(obj["round"], "round")
    timestamp = obj["timestamp"]
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not math.isfinite(timestamp):
        raise _Reject("wrong_type", "timestamp is not a finite number")
    # Check the round before walking the groups: stale payloads are the common case and cheap to drop.
    if round_ < current_round - limits.ttl_rounds:
        raise _Reject("stale_round", f"round {round_} < {current_round} - {limits.ttl_rounds}")
    if round_ > current_round + limits.ttl_rounds:
        raise _Reject("future_round", f"round {round_} > {current_round} + {limits.ttl_rounds}")

    groups = obj["groups"]
    if not isinstance(groups, list):
        raise _Reject("wrong_type", "groups is not a list")
    if len(groups) > limits.max_groups:
        raise _Reject("too_many_groups", f"{len(groups)} > {limits.max_groups}")
    return RolloutPayload(
        node_id=node_id,
        round=round_,
        timestamp=float(timestamp),
        groups=tuple(_check_group(g, i, limits) for i, g in enumerate(groups)),
    )


def decode_payload(
    data: Any, limits: PayloadLimits, *, current_round: int, key: bytes | str | None = None
) -> RolloutPayload | Rejection:
    """Decode and validate; anything a peer can send yields a payload or a `Rejection`, never an exception."""
    try:
        return _decode(data, limits, current_round, _as_key(key))
    except _Reject as r:
        return Rejection(r.reason, r.detail)


class DropCounter:
    """Counts dropped payloads by reason, for metrics and logs."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def record(self, rejection: Rejection, source: str = "?") -> None:
        self.counts[rejection.reason] += 1
        logger.warning("dropped rollout payload from %s: %s %s", source, rejection.reason, rejection.detail)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)


class PayloadDecoder:
    """`decode_payload` plus drop accounting: returns the payload, or None after counting the drop."""

    def __init__(self, limits: PayloadLimits, key: bytes | str | None = None):
        self.limits = limits
        self.key = _as_key(key)
        self.drops = DropCounter()

    def __call__(self, data: Any, current_round: int, source: str = "?") -> RolloutPayload | None:
        result = decode_payload(data, self.limits, current_round=current_round, key=self.key)
        if isinstance(result, Rejection):
            self.drops.record(result, source)
            return None
        return result
