import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decentrain.algorithms.sapo.payload import (
    REJECT_REASONS,
    SCHEMA_VERSION,
    PayloadDecoder,
    PayloadLimits,
    Rejection,
    RolloutGroup,
    RolloutPayload,
    decode_payload,
    encode_payload,
)

G = 4
LIMITS = PayloadLimits(num_generations=G, max_bytes=64 * 1024, max_groups=8, max_string_chars=256,
                       max_metadata_bytes=512, ttl_rounds=2)
KEY = b"swarm-secret"


def group(i: int = 0) -> RolloutGroup:
    return RolloutGroup(
        question=f"Calculate {i} + 1. ü", answer=str(i + 1), task="basic_arithmetic",
        metadata={"expression": f"{i} + 1", "num_terms": 2, "nested": {"xs": [1, 2.5, None, True]}},
        completions=tuple(f"{i + k}\n" for k in range(G)),
    )


def payload(round_: int = 10, n: int = 2) -> RolloutPayload:
    return RolloutPayload(node_id="node-3", round=round_, timestamp=1.7e9, groups=tuple(group(i) for i in range(n)))


def body_of(obj) -> bytes:
    return b"DTR1\n" + json.dumps(obj).encode()


def valid_obj() -> dict:
    return json.loads(encode_payload(payload()).split(b"\n", 1)[1])


def test_roundtrip_unsigned_and_signed():
    p = payload()
    assert decode_payload(encode_payload(p), LIMITS, current_round=10) == p
    assert decode_payload(encode_payload(p, KEY), LIMITS, current_round=10, key=KEY) == p
    assert decode_payload(encode_payload(p, KEY), LIMITS, current_round=10) == p  # no key: signature ignored
    assert p.key == (10, "node-3")


@pytest.mark.parametrize(
    "data, reason",
    [
        ("a str", "not_bytes"),
        (b"x" * (LIMITS.max_bytes + 1), "too_large"),
        (b'{"version": 1}', "bad_frame"),
        (b"DTR1 abc\n{}", "bad_frame"),
        (b"DTR1\n\xff\xfe{}", "invalid_utf8"),
        (b"DTR1\n{not json", "bad_json"),
        (b"DTR1\n" + b"[" * 10_000 + b"]" * 10_000, "bad_json"),
        (b'DTR1\n{"timestamp": NaN}', "bad_json"),
        (b"DTR1\n[]", "wrong_type"),
        (b'DTR1\n{"version": 2}', "bad_version"),
        (b'DTR1\n{"version": 1}', "missing_field"),
    ],
)
def test_malformed_bytes(data, reason):
    result = decode_payload(data, LIMITS, current_round=10)
    assert isinstance(result, Rejection) and result.reason == reason, result


def test_overflowing_number_is_not_finite():
    wire = encode_payload(payload())
    assert b'"timestamp":1700000000.0' in wire
    wire = wire.replace(b'"timestamp":1700000000.0', b'"timestamp":1e999')
    assert decode_payload(wire, LIMITS, current_round=10).reason == "wrong_type"
    huge_int = wire.replace(b'"timestamp":1e999', b'"timestamp":' + b"9" * 5000)
    assert decode_payload(huge_int, LIMITS, current_round=10).reason == "bad_json"


def mutate(path, value):
    obj = valid_obj()
    target = obj
    for k in path[:-1]:
        target = target[k]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body_of(obj)


@pytest.mark.parametrize(
    "path, value, reason",
    [
        (("round",), 7, "stale_round"),
        (("round",), 13, "future_round"),
        (("round",), True, "wrong_type"),
        (("round",), "10", "wrong_type"),
        (("timestamp",), "now", "wrong_type"),
        (("node_id",), None, "wrong_type"),
        (("node_id",), "n" * 1000, "string_too_long"),
        (("node_id",), "\ud800", "invalid_utf8"),
        (("extra",), 1, "unexpected_field"),
        (("groups",), KeyError, "missing_field"),
        (("groups",), {}, "wrong_type"),
        (("groups",), [valid_obj()["groups"][0]] * 9, "too_many_groups"),
        (("groups", 0, "completions"), ["a"] * (G - 1), "wrong_num_generations"),
        (("groups", 0, "completions"), ["a"] * (G + 1), "wrong_num_generations"),
        (("groups", 0, "completions"), [1] * G, "wrong_type"),
        (("groups", 0, "completions"), "abcd", "wrong_type"),
        (("groups", 0, "question"), "q" * 257, "string_too_long"),
        (("groups", 0, "answer"), 42, "wrong_type"),
        (("groups", 0, "task"), KeyError, "missing_field"),
        (("groups", 0, "metadata"), [1], "wrong_type"),
        (("groups", 0, "metadata"), {"k": "v" * 200, "l": "v" * 200, "m": "v" * 200}, "metadata_too_large"),
        (("groups", 0, "metadata"), {"a": {"b": {"c": {"d": {"e": {}}}}}}, "metadata_too_large"),
        (("groups", 0, "metadata"), {"k": "\udfff"}, "invalid_utf8"),
        (("groups", 0), "not a group", "wrong_type"),
    ],
)
def test_schema_violations(path, value, reason):
    result = decode_payload(mutate(path, value), LIMITS, current_round=10)
    assert isinstance(result, Rejection) and result.reason == reason, result


def test_signatures():
    p = payload()
    assert decode_payload(encode_payload(p), LIMITS, current_round=10, key=KEY).reason == "unsigned"
    assert decode_payload(encode_payload(p, b"other"), LIMITS, current_round=10, key=KEY).reason == "bad_signature"
    signed = bytearray(encode_payload(p, KEY))
    signed[-3] ^= 1  # tamper with the body
    assert decode_payload(bytes(signed), LIMITS, current_round=10, key=KEY).reason == "bad_signature"


def test_decoder_counts_drops():
    dec = PayloadDecoder(LIMITS, key="swarm-secret")
    assert dec(encode_payload(payload(), KEY), current_round=10) == payload()
    assert dec(encode_payload(payload()), current_round=10) is None
    assert dec(encode_payload(payload(round_=1), KEY), current_round=10) is None
    assert dec(b"junk", current_round=10) is None
    assert dec.drops.as_dict() == {"unsigned": 1, "stale_round": 1, "bad_frame": 1}
    assert dec.drops.total == 3


def test_limits_validation():
    with pytest.raises(ValueError, match="num_generations"):
        PayloadLimits(num_generations=0)


# --- property-based: hostile peers -----------------------------------------------------------

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_value = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=20
)


@st.composite
def hostile_object(draw):
    """A payload-shaped object with a few fields replaced by hostile values."""
    obj = valid_obj()
    obj["round"] = draw(st.integers(-5, 20) | st.just(10))
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["top", "group", "completions", "metadata"]))
        value = draw(json_value | st.text(min_size=300, max_size=400) | st.just("\ud800"))
        if where == "top":
            key = draw(st.sampled_from(sorted(obj) + ["junk"]))
            if draw(st.booleans()):
                obj.pop(key, None)
            else:
                obj[key] = value
        elif isinstance(obj.get("groups"), list) and obj["groups"] and isinstance(obj["groups"][0], dict):
            g = obj["groups"][0]
            if where == "group":
                g[draw(st.sampled_from(["question", "answer", "task", "metadata", "completions", "x"]))] = value
            elif where == "completions":
                g["completions"] = draw(st.lists(json_value | st.text(max_size=300), max_size=G + 2))
            else:
                g["metadata"] = {"k": value}
    return obj


def check_never_raises(data: bytes, key=None) -> None:
    dec = PayloadDecoder(LIMITS, key=key)
    out = dec(data, current_round=10)
    if out is None:
        assert dec.drops.total == 1 and set(dec.drops.counts) <= set(REJECT_REASONS)
    else:
        assert isinstance(out, RolloutPayload) and out.version == SCHEMA_VERSION
        assert all(len(g.completions) == G for g in out.groups)
        assert 8 <= out.round <= 12


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_object())
def test_hostile_objects_are_rejected_or_valid(obj):
    data = b"DTR1\n" + json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    check_never_raises(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_raise(data):
    check_never_raises(data)
    check_never_raises(b"DTR1\n" + data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 200))
def test_signed_payloads_with_flipped_bytes_are_dropped(junk, pos):
    wire = bytearray(encode_payload(payload(), KEY))
    pos = pos % len(wire)
    wire[pos : pos + len(junk)] = junk
    if bytes(wire) == encode_payload(payload(), KEY):
        return
    dec = PayloadDecoder(LIMITS, key=KEY)
    assert dec(bytes(wire), current_round=10) is None and dec.drops.total == 1
