"""Rollout payloads: the only bytes SAPO nodes exchange. Decoding parses JSON and never unpickles.

Wire format: a one-line ASCII header, then the UTF-8 JSON body.

    DTR2 <ed25519 public key, 64 hex> <ed25519 signature of body, 128 hex>[ <hmac-sha256 of body, 64 hex>]\\n
    {"version":1,"node_id":<the same public key>,"name":"node0","round":3,"timestamp":1.7e9,
     "groups":[{"task":"chain_sum","config":<16 hex>,"seed":1,"size":10000,"index":42,
                "question":"...","completions":["...", ...]}]}

Optional (`loss.external_is`): a payload-level "tokenizer" (16 hex, `offpolicy.tokenizer_fingerprint`)
and a group-level "logprobs": G entries, each null or the sender's sampling log-probs of that
completion's tokens. They are numbers a receiver uses or drops, never a reason to refuse a payload:
a bad entry drops the payload's or group's log-probs (`RolloutPayload.logprob_drops` says why) and
the group is still used; only the byte and value caps apply to them as to everything else.

A group names a reasoning-gym entry (task, task-config hash, dataset seed, size, index) instead
of carrying an answer: the receiver rebuilds the entry, answer and metadata locally and scores
against that (decentrain/tasks/mixture.py). The signature covers the body bytes as sent, so no
canonical re-serialisation is needed; the body's node_id must equal the signing key.

`decode_payload` is total: any bytes yield a payload or a `Rejection`, in time bounded by the
size cap (the structure is counted before it is parsed). Public API, stable for other modules
and benchmarks: `encode_payload(payload, identity, key=None)`, `decode_payload(data, limits, *,
current_round, key=None, now=None)`, `PayloadDecoder(limits, key)(data, current_round, source, now)`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from decentrain.algorithms.sapo.offpolicy import check_logprobs
from decentrain.core.identity import (
    PUBLIC_KEY_HEX_LEN,
    SIGNATURE_HEX_LEN,
    NodeIdentity,
    check_node_name,
    is_public_key_hex,
    safe_label,
    verify_signature,
)

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_MAGIC = b"DTR2"
_HMAC_HEX_LEN = 64
_MAX_HEADER = len(_MAGIC) + 3 + PUBLIC_KEY_HEX_LEN + SIGNATURE_HEX_LEN + _HMAC_HEX_LEN
_PAYLOAD_FIELDS = ("version", "node_id", "name", "round", "timestamp", "groups")
_GROUP_FIELDS = ("task", "config", "seed", "size", "index", "question", "completions")
_OPTIONAL_PAYLOAD_FIELDS = ("tokenizer",)
_OPTIONAL_GROUP_FIELDS = ("logprobs",)
_CONFIG_ID = re.compile(r"[0-9a-f]{16}")
_MAX_INT_DIGITS = 18  # every legitimate integer fits; a 400-digit one is refused while parsing
MAX_ROUND = 1 << 40
MAX_SEED = (1 << 31) - 1
MAX_TIMESTAMP = 1e11  # seconds since the epoch (year 5138)

# Every reason a payload can be dropped for; stable strings, used as metric names.
REJECT_REASONS = (
    "not_bytes",
    "too_large",
    "bad_frame",
    "too_many_values",
    "unsigned",
    "bad_signature",
    "bad_node_signature",
    "invalid_utf8",
    "bad_json",
    "duplicate_key",
    "number_out_of_range",
    "bad_version",
    "missing_field",
    "unexpected_field",
    "wrong_type",
    "bad_id",
    "too_many_groups",
    "string_too_long",
    "wrong_num_generations",
    "stale_round",
    "future_round",
    "stale_timestamp",
    "future_timestamp",
    "replayed",
)


@dataclass(frozen=True)
class RolloutGroup:
    """One question and its G completions, as text, plus the address of its reasoning-gym entry.

    `config` identifies the task's reasoning-gym config (`decentrain.tasks.task_config_id`);
    (seed, size, index) select the entry. Each receiver rebuilds the answer and re-scores.
    """

    task: str
    config: str
    seed: int
    size: int
    index: int
    question: str
    completions: tuple[str, ...]
    # The sender's sampling log-probs of each completion's tokens (None: not sent or dropped);
    # only trusted after the receiver's own checks (inbox.py, `loss.external_is`).
    logprobs: tuple[tuple[float, ...] | None, ...] | None = None


@dataclass(frozen=True)
class RolloutPayload:
    node_id: str  # the sender's Ed25519 public key, hex
    round: int
    timestamp: float
    groups: tuple[RolloutGroup, ...]
    name: str = "node"  # human-readable, for logs only; ids are what count
    version: int = SCHEMA_VERSION
    tokenizer: str | None = None  # the sender's declared tokenizer fingerprint (16 hex), unverified
    logprob_drops: tuple[str, ...] = ()  # one LOGPROB_DROP_REASONS entry per dropped set of log-probs

    @property
    def key(self) -> tuple[int, str]:
        """Records are keyed by (round, peer): one payload per node per round."""
        return (self.round, self.node_id)


@dataclass
class PayloadLimits:
    num_generations: int = 8  # every group must carry exactly G completions
    max_bytes: int = 1 << 20
    max_groups: int = 64
    max_string_chars: int = 4096  # per question and completion
    max_dataset_size: int = 10_000_000  # a group's `size` field
    ttl_rounds: int = 2  # accept rounds in [current - ttl, current + ttl]
    # Asynchronous backends (hivemind): the signed timestamp must be within this many seconds of
    # the receiver's clock, so an old record replayed to a fresh node is dropped.
    max_age_s: float = 300.0
    max_peers_tracked: int = 4096  # replay high-water marks kept (least recently seen evicted)
    # What one sender may cost this node per round (decentrain/algorithms/sapo/sender_budget.py): the
    # seconds spent rebuilding its entries and scoring its completions, plus these charges.
    sender_budget_s: float = 2.0
    mismatch_cost_s: float = 0.25  # per group that does not rebuild (wrong question, address, task)
    malformed_cost_s: float = 0.01  # per answer that does not parse in its task's format
    # What all senders together may cost per round, split among them by merit (sender_budget.py): fresh
    # identities are free to make, so without it N of them would cost N x sender_budget_s.
    round_budget_s: float = 8.0
    # Optional sender log-probs (`loss.external_is`): at most this many per completion, and this
    # many in a whole payload (what the value count before parsing allows on top of the rest).
    max_logprob_tokens: int = 512
    max_logprob_values: int = 65536

    def __post_init__(self) -> None:
        for name in ("sender_budget_s", "mismatch_cost_s", "malformed_cost_s", "round_budget_s"):
            value = getattr(self, name)
            positive = name in ("sender_budget_s", "round_budget_s")
            if not (math.isfinite(value) and value >= 0) or (positive and value == 0):
                raise ValueError(f"payload.{name}={value} must be finite and {'> 0' if positive else '>= 0'}")
        for name in (
            "num_generations",
            "max_bytes",
            "max_groups",
            "max_string_chars",
            "max_dataset_size",
            "max_peers_tracked",
            "max_logprob_tokens",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"payload.{name}={getattr(self, name)} must be > 0")
        if self.max_logprob_values < 0:
            raise ValueError(f"payload.max_logprob_values={self.max_logprob_values} must be >= 0")
        if self.ttl_rounds < 0:
            raise ValueError(f"payload.ttl_rounds={self.ttl_rounds} must be >= 0")
        if not (math.isfinite(self.max_age_s) and self.max_age_s > 0):
            raise ValueError(f"payload.max_age_s={self.max_age_s} must be finite and > 0")

    @property
    def max_values(self) -> int:
        """An upper bound on the JSON values (and structural characters) of a valid payload."""
        fields = len(_GROUP_FIELDS) + len(_OPTIONAL_GROUP_FIELDS)
        return 34 + self.max_groups * (2 * fields + 2 * self.num_generations + 4)

    @property
    def max_containers(self) -> int:
        """An upper bound on the arrays and objects of a valid payload (each group's log-probs: G + 1)."""
        return 4 + self.max_groups * (self.num_generations + 4)


@dataclass(frozen=True)
class Rejection:
    reason: str  # one of REJECT_REASONS
    detail: str = ""


class _Reject(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def check_swarm_key(key: bytes | str | None) -> bytes | None:
    """The swarm key as bytes; an empty key would let anyone forge, so it is refused."""
    if key is None:
        return None
    if not isinstance(key, (bytes, str)) or len(key) == 0:
        raise ValueError("swarm_key must be a non-empty string, or null for no membership gate")
    return key.encode("utf-8") if isinstance(key, str) else key


def _hmac(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode("ascii")


def encode_payload(payload: RolloutPayload, identity: NodeIdentity, key: bytes | str | None = None) -> bytes:
    """Serialise and sign `payload` with this node's key (and the swarm key, if any)."""
    if payload.node_id != identity.node_id:
        raise ValueError("payload.node_id must be the signing identity's node_id")
    obj = {
        "version": payload.version,
        "node_id": payload.node_id,
        "name": payload.name,
        "round": payload.round,
        "timestamp": payload.timestamp,
        "groups": [
            {
                "task": g.task,
                "config": g.config,
                "seed": g.seed,
                "size": g.size,
                "index": g.index,
                "question": g.question,
                "completions": list(g.completions),
            }
            for g in payload.groups
        ],
    }
    if payload.tokenizer is not None:
        obj["tokenizer"] = payload.tokenizer
    for g, wire in zip(payload.groups, obj["groups"]):
        if g.logprobs is not None:  # 6 decimals: well under the fp32 noise of a log-prob, a third of the bytes
            wire["logprobs"] = [None if lp is None else [round(float(x), 6) for x in lp] for lp in g.logprobs]
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    header = b" ".join([_MAGIC, identity.node_id.encode("ascii"), identity.sign(body)])
    key = check_swarm_key(key)
    if key:
        header += b" " + _hmac(key, body)
    return header + b"\n" + body


# -- parsing -------------------------------------------------------------------------------------


def _count_values(body: bytes, limits: PayloadLimits) -> None:
    """Refuse bodies with more JSON values than any valid payload, before parsing them.

    Parsing time grows with the number of values, not bytes: 1 MiB of `[]` takes ~60 ms to
    parse. Everything here runs in C over the bytes: drop escaped backslashes and quotes, then
    the even pieces between quotes are outside strings, where `, : [ {` count the values.
    For valid JSON the count is exact; invalid JSON is refused by the parser afterwards.
    Arrays and objects (`[ {`, which nest) and strings have the tight bounds of the fields;
    separators (`, :`) also `max_logprob_values` more, the numbers of optional log-probs.
    """
    limit, containers = limits.max_values, limits.max_containers
    separators = limit + limits.max_logprob_values

    def excess(b: bytes) -> str | None:
        if (n := b.count(b"[") + b.count(b"{")) > containers:
            return f"{n} arrays/objects > {containers}"
        if (n := b.count(b",") + b.count(b":")) > separators:
            return f"{n} values > {separators}"
        return None

    # Upper bound on unescaped quotes: a quote after one backslash is escaped, after two may not be.
    quotes = body.count(b'"') - body.count(b'\\"') + body.count(b'\\\\"')
    if excess(body) is None and quotes <= 2 * limit:
        return  # counting string contents too, it is already within the bound (the usual case)
    s = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    if s.count(b'"') > 2 * limit:
        raise _Reject("too_many_values", "too many strings")
    pieces = s.split(b'"')
    if (why := excess(b"".join(pieces[0::2]))) is not None:
        raise _Reject("too_many_values", why)
    # Odd pieces are string contents; an encoded char takes at most 6 bytes (\u00XX).
    if len(pieces) > 1 and max(map(len, pieces[1::2])) > 6 * limits.max_string_chars:
        raise _Reject("string_too_long", f"a string over {6 * limits.max_string_chars} bytes")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Reject("duplicate_key", safe_label(sorted(k for k, _ in pairs)[:8]))
    return obj


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _Reject("number_out_of_range", f"integer of {len(text)} digits")
    return int(text)


def _reject_constant(name: str) -> None:
    raise _Reject("bad_json", f"non-finite constant {name}")


def _check_str(value: Any, what: str, limits: PayloadLimits) -> str:
    if type(value) is not str:
        raise _Reject("wrong_type", f"{what} is {type(value).__name__}, not str")
    if len(value) > limits.max_string_chars:
        raise _Reject("string_too_long", f"{what} has {len(value)} chars > {limits.max_string_chars}")
    try:  # JSON escapes can smuggle lone surrogates, which are not UTF-8
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Reject("invalid_utf8", f"{what} has a lone surrogate") from None
    return value


def _check_int(value: Any, what: str, lo: int, hi: int) -> int:
    if type(value) is not int:  # exact: bool is an int subclass, 1.0 is not an int
        raise _Reject("wrong_type", f"{what} is {type(value).__name__}, not int")
    if not lo <= value <= hi:
        raise _Reject("number_out_of_range", f"{what}={value} not in [{lo}, {hi}]")
    return value


def _check_fields(obj: Any, fields: tuple[str, ...], what: str, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if type(obj) is not dict:
        raise _Reject("wrong_type", f"{what} is {type(obj).__name__}, not an object")
    if missing := set(fields) - obj.keys():
        raise _Reject("missing_field", f"{what} lacks {sorted(missing)}")
    if extra := obj.keys() - set(fields) - set(optional):
        raise _Reject("unexpected_field", f"{what} has {safe_label(sorted(extra)[:5])}")
    return obj


def _check_group(obj: Any, index: int, limits: PayloadLimits, drops: list[str]) -> RolloutGroup:
    what = f"groups[{index}]"
    g = _check_fields(obj, _GROUP_FIELDS, what, _OPTIONAL_GROUP_FIELDS)
    task = _check_str(g["task"], f"{what}.task", limits)
    config = _check_str(g["config"], f"{what}.config", limits)
    if not _CONFIG_ID.fullmatch(config):
        raise _Reject("wrong_type", f"{what}.config is not 16 hex chars")
    seed = _check_int(g["seed"], f"{what}.seed", 0, MAX_SEED)
    size = _check_int(g["size"], f"{what}.size", 1, limits.max_dataset_size)
    entry = _check_int(g["index"], f"{what}.index", 0, size - 1)
    question = _check_str(g["question"], f"{what}.question", limits)
    completions = g["completions"]
    if type(completions) is not list:
        raise _Reject("wrong_type", f"{what}.completions is not a list")
    if len(completions) != limits.num_generations:
        raise _Reject("wrong_num_generations", f"{what} has {len(completions)} != {limits.num_generations}")
    completions = tuple(_check_str(c, f"{what}.completions[]", limits) for c in completions)
    logprobs = None
    if "logprobs" in g:
        logprobs, why = check_logprobs(g["logprobs"], limits.num_generations, limits.max_logprob_tokens)
        if why is not None:
            drops.append(why)
    return RolloutGroup(task, config, seed, size, entry, question, completions, logprobs)


def _decode(
    data: Any, limits: PayloadLimits, current_round: int, key: bytes | None, now: float | None
) -> RolloutPayload:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _Reject("not_bytes", type(data).__name__)
    if len(data) > limits.max_bytes:  # before copying anything
        raise _Reject("too_large", f"{len(data)} bytes > {limits.max_bytes}")
    data = bytes(data)

    end = data.find(b"\n", 0, _MAX_HEADER + 1)
    parts = data[:end].split(b" ") if end >= 0 else []
    if not (
        parts
        and parts[0] == _MAGIC
        and len(parts) in (3, 4)
        and len(parts[1]) == PUBLIC_KEY_HEX_LEN
        and len(parts[2]) == SIGNATURE_HEX_LEN
        and (len(parts) == 3 or len(parts[3]) == _HMAC_HEX_LEN)
    ):
        raise _Reject("bad_frame", repr(data[:16]))
    body = data[end + 1 :]
    _count_values(body, limits)
    if key is not None:  # membership first: a keyed swarm drops outsiders before any public-key math
        if len(parts) != 4:
            raise _Reject("unsigned")
        if not hmac.compare_digest(parts[3], _hmac(key, body)):
            raise _Reject("bad_signature")
    try:
        node_id = parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise _Reject("bad_frame", "non-ASCII key") from None
    if not is_public_key_hex(node_id):
        raise _Reject("bad_id", "public key is not 64 lowercase hex chars")
    if not verify_signature(node_id, parts[2], body):
        raise _Reject("bad_node_signature", node_id[:16])

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Reject("invalid_utf8", str(e)[:80]) from None
    try:
        obj = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_int=_bounded_int, parse_constant=_reject_constant
        )
    except (ValueError, RecursionError) as e:  # RecursionError: deeply nested arrays
        raise _Reject("bad_json", str(e)[:80]) from None

    if type(obj) is dict and "version" in obj and (type(obj["version"]) is not int or obj["version"] != SCHEMA_VERSION):
        raise _Reject("bad_version", safe_label(obj["version"], 16))
    obj = _check_fields(obj, _PAYLOAD_FIELDS, "payload", _OPTIONAL_PAYLOAD_FIELDS)
    if obj["node_id"] != node_id:
        raise _Reject("bad_id", "body node_id is not the signing key")
    if (why := check_node_name(obj["name"])) is not None:
        raise _Reject("bad_id", f"name {why}")
    round_ = _check_int(obj["round"], "round", 0, MAX_ROUND)
    timestamp = obj["timestamp"]
    if type(timestamp) not in (int, float):
        raise _Reject("wrong_type", f"timestamp is {type(timestamp).__name__}, not a number")
    if not 0 <= timestamp <= MAX_TIMESTAMP:  # also false for inf and nan
        raise _Reject("number_out_of_range", f"timestamp not in [0, {MAX_TIMESTAMP:g}]")
    # Cheap checks before walking the groups: stale payloads are the common case.
    if round_ < current_round - limits.ttl_rounds:
        raise _Reject("stale_round", f"round {round_} < {current_round} - {limits.ttl_rounds}")
    if round_ > current_round + limits.ttl_rounds:
        raise _Reject("future_round", f"round {round_} > {current_round} + {limits.ttl_rounds}")
    if now is not None:
        if timestamp < now - limits.max_age_s:
            raise _Reject("stale_timestamp", f"{now - timestamp:.0f} s old > {limits.max_age_s}")
        if timestamp > now + limits.max_age_s:
            raise _Reject("future_timestamp", f"{timestamp - now:.0f} s ahead > {limits.max_age_s}")

    groups = obj["groups"]
    if type(groups) is not list:
        raise _Reject("wrong_type", "groups is not a list")
    if len(groups) > limits.max_groups:
        raise _Reject("too_many_groups", f"{len(groups)} > {limits.max_groups}")
    drops: list[str] = []
    tokenizer = obj.get("tokenizer")
    if tokenizer is not None and not (type(tokenizer) is str and _CONFIG_ID.fullmatch(tokenizer)):
        drops.append("bad_tokenizer_id")  # without a fingerprint, the receiver uses no log-probs
        tokenizer = None
    checked = tuple(_check_group(g, i, limits, drops) for i, g in enumerate(groups))
    return RolloutPayload(
        node_id=node_id,
        name=obj["name"],
        round=round_,
        timestamp=float(timestamp),
        groups=checked,
        tokenizer=tokenizer,
        logprob_drops=tuple(drops),
    )


def decode_payload(
    data: Any,
    limits: PayloadLimits,
    *,
    current_round: int,
    key: bytes | str | None = None,
    now: float | None = None,
) -> RolloutPayload | Rejection:
    """Decode and verify; anything a peer can send yields a payload or a `Rejection`, never an exception.

    `key`: the swarm key (HMAC membership gate); `now`: the receiver's clock, for asynchronous
    backends, where the signed timestamp must lie within `limits.max_age_s` of it.
    """
    try:
        return _decode(data, limits, current_round, check_swarm_key(key), now)
    except _Reject as r:
        return Rejection(r.reason, r.detail)


class DropCounter:
    """Counts drops by reason, for metrics and logs.

    Each drop is logged at DEBUG; `flush_log` writes one WARNING line for all drops since its
    last call, so a flood of junk costs one log line per round, not one per record.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._unlogged: Counter[str] = Counter()

    def record(self, rejection: Rejection, source: str = "?") -> None:
        self.counts[rejection.reason] += 1
        self._unlogged[rejection.reason] += 1
        # Peer text only through safe_label: no control or bidi characters reach the log.
        logger.debug(
            "dropped rollout payload from %s: %s %s",
            safe_label(source),
            rejection.reason,
            safe_label(rejection.detail, 96),
        )

    def flush_log(self, what: str = "") -> None:
        if self._unlogged:
            logger.warning(
                "%sdropped %d rollout payload(s): %s",
                what,
                sum(self._unlogged.values()),
                ", ".join(f"{k}={v}" for k, v in sorted(self._unlogged.items())),
            )
            self._unlogged.clear()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)


class PayloadDecoder:
    """`decode_payload` plus drop accounting and replay protection.

    Per sender key it keeps a high-water mark, the (round, timestamp) of the last payload it
    accepted. A payload is `replayed` unless its signed timestamp is newer than the mark and its
    round differs: an old record sent again is dropped, and so is a second payload for the same
    round, while a peer that restarted from an older checkpoint (older round, newer time) is not.
    """

    def __init__(self, limits: PayloadLimits, key: bytes | str | None = None):
        self.limits = limits
        self.key = check_swarm_key(key)
        self.drops = DropCounter()
        self.high_water: OrderedDict[str, tuple[int, float]] = OrderedDict()
        # Payloads accepted per sender: when the table is full, the marks of senders with the
        # fewest go first, so a burst of fresh keys evicts each other, not a long-standing peer's.
        self.accepted: Counter[str] = Counter()

    def _replayed(self, payload: RolloutPayload) -> Rejection | None:
        last = self.high_water.get(payload.node_id)
        if last is not None and (payload.timestamp <= last[1] or payload.round == last[0]):
            return Rejection("replayed", f"round {payload.round} after {last[0]} from {payload.node_id[:16]}")
        return None

    def _decode(self, data: Any, current_round: int, now: float | None) -> RolloutPayload | Rejection:
        return decode_payload(data, self.limits, current_round=current_round, key=self.key, now=now)

    def peek(self, data: Any, current_round: int, now: float | None = None) -> RolloutPayload | None:
        """What `__call__` would return, without recording anything (for an exchange counting valid peers)."""
        result = self._decode(data, current_round, now)
        return result if isinstance(result, RolloutPayload) and self._replayed(result) is None else None

    def __call__(
        self, data: Any, current_round: int, source: str = "?", now: float | None = None
    ) -> RolloutPayload | None:
        return self.accept(self._decode(data, current_round, now), source)

    def accept(self, result: RolloutPayload | Rejection, source: str = "?") -> RolloutPayload | None:
        """Record a verdict: a decoded payload (one `peek` returned is not parsed again) or a drop.
        Replay is asked here, at acceptance: a payload of the same sender may have been accepted since the peek."""
        if isinstance(result, RolloutPayload):
            result = self._replayed(result) or result
        if isinstance(result, Rejection):
            self.drops.record(result, source)
            return None
        self.high_water[result.node_id] = (result.round, result.timestamp)
        self.high_water.move_to_end(result.node_id)
        self.accepted[result.node_id] += 1
        if len(self.high_water) > self.limits.max_peers_tracked:
            # Fewest accepted payloads first, least recently seen among those (OrderedDict order).
            order = {k: i for i, k in enumerate(self.high_water)}
            victim = min(
                (k for k in self.high_water if k != result.node_id), key=lambda k: (self.accepted[k], order[k])
            )
            del self.high_water[victim]
            self.accepted.pop(victim, None)
        return result
