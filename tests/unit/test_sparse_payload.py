"""The sparse payload's wire format: exact round trip, and a decoder that drops (never raises on) bad bytes."""

import random
import struct

import numpy as np
import pytest
import torch

from decentrain.algorithms.outer.compression import CompressionSpec, compress, decompress
from decentrain.algorithms.outer.sparse_payload import _HEADER, decode, encode, payload_bytes

SPEC = CompressionSpec.flat(numel=1000, chunk=128, k=8, bits=2)


def _payload(round_=3, seed=0):
    x = torch.randn(SPEC.numel, generator=torch.Generator().manual_seed(seed))
    return compress(x, SPEC), encode(compress(x, SPEC), SPEC, round_)


def test_roundtrip_is_exact_and_sized_as_announced():
    c, data = _payload()
    assert len(data) == payload_bytes(SPEC) == 32 + 8 * 8 * 2 + 8 * 4 + 8 * 8 * 2 // 8
    got, why = decode(data, SPEC, 3)
    assert why == ""
    assert torch.equal(decompress(got, SPEC), decompress(c, SPEC))


@pytest.mark.parametrize("bits", [4, 8])
def test_roundtrip_other_widths(bits):
    spec = CompressionSpec.flat(numel=300, chunk=64, k=5, bits=bits)
    c = compress(torch.randn(300), spec)
    got, _ = decode(encode(c, spec, 0), spec, 0)
    assert torch.equal(decompress(got, spec), decompress(c, spec))


def _with(data: bytes, offset: int, raw: bytes) -> bytes:
    return data[:offset] + raw + data[offset + len(raw) :]


def test_each_bad_field_is_dropped_with_its_reason():
    _, data = _payload(round_=3)
    idx_off, scale_off = 32, 32 + 2 * SPEC.kept
    cases = {
        "size": data[:-1],
        "magic": _with(data, 0, b"XXXX"),
        "layout": _with(data, 0, _HEADER.pack(b"DSLC", 2, 4, 0, 0, 3, SPEC.numel, SPEC.digest())),
        "tiles": _with(data, 0, _HEADER.pack(b"DSLC", 2, 2, 0, 0, 3, SPEC.numel, SPEC.digest() ^ 1)),
        "quantizer": _with(data, 0, _HEADER.pack(b"DSLC", 2, 2, 1, 0, 3, SPEC.numel, SPEC.digest())),
        "round": _with(data, 0, _HEADER.pack(b"DSLC", 2, 2, 0, 0, 2, SPEC.numel, SPEC.digest())),
        "indices": _with(data, idx_off, struct.pack("<H", 128)),
        "increasing": _with(data, idx_off, struct.pack("<HH", 5, 5)),
        "scale": _with(data, scale_off, struct.pack("<f", float("nan"))),
        "negative": _with(data, scale_off, struct.pack("<f", -1.0)),
    }
    for name, bad in cases.items():
        got, why = decode(bad, SPEC, 3)
        assert got is None and why, name


def test_decoder_never_raises_on_random_or_mutated_bytes():
    _, data = _payload()
    rng = random.Random(0)
    for i in range(300):
        if i % 3 == 0:
            bad = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 5, 32, len(data)])))
        else:
            b = bytearray(data)
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.getrandbits(8)
            bad = bytes(b)
        got, why = decode(bad, SPEC, 3)
        assert (got is None) == bool(why)
        if got is not None:  # a mutation that kept it valid must still decode to sane values
            assert torch.isfinite(decompress(got, SPEC)).all()


def test_header_is_little_endian_and_32_bytes():
    _, data = _payload(round_=7)
    assert _HEADER.size == 32 and data[:4] == b"DSLC"
    assert int(np.frombuffer(data, "<u8", count=1, offset=8)[0]) == 7
