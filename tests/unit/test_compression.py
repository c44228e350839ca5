"""Top-k + b-bit compression with error feedback, against hand-computed numbers."""

import pytest
import torch

from decentrain.algorithms.common.compression import (
    CompressionSpec, ErrorFeedback, compress, decompress, dequantize_symmetric, pack_codes, quantize_symmetric,
    topk_per_chunk, unpack_codes,
)


def test_topk_per_chunk_keeps_largest_magnitudes_sorted_by_index():
    x = torch.tensor([[0.1, -3.0, 2.0, 0.5], [4.0, 0.0, -0.2, -5.0]])
    idx, vals = topk_per_chunk(x, 2)
    assert idx.tolist() == [[1, 2], [0, 3]]
    assert vals.tolist() == [[-3.0, 2.0], [4.0, -5.0]]


def test_two_bit_levels_are_plus_minus_s_and_s_over_3():
    # s = 3; levels -3, -1, 1, 3; step 2
    vals = torch.tensor([[-3.0, -0.9, 1.2, 3.0, 2.1]])
    codes, scale = quantize_symmetric(vals, 2)
    assert scale.tolist() == [3.0]
    # (v + 3) / 2 = 0, 1.05, 2.1, 3, 2.55 -> 0, 1, 2, 3, 3
    assert codes.tolist() == [[0, 1, 2, 3, 3]]
    assert dequantize_symmetric(codes, scale, 2).tolist() == [[-3.0, -1.0, 1.0, 3.0, 3.0]]


def test_eight_bit_error_is_under_half_a_step():
    vals = torch.linspace(-1, 1, 101)[None, :]
    codes, scale = quantize_symmetric(vals, 8)
    err = (dequantize_symmetric(codes, scale, 8) - vals).abs().max().item()
    assert err <= (2 / 255) / 2 + 1e-6


def test_zero_chunk_decodes_to_zero():
    codes, scale = quantize_symmetric(torch.zeros(1, 4), 2)
    assert dequantize_symmetric(codes, scale, 2).tolist() == [[0.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_roundtrip(bits):
    codes = torch.randint(0, 1 << bits, (37,), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.numel() == -(-37 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits, 37), codes)


def test_two_bit_packing_is_low_bits_first():
    assert pack_codes(torch.tensor([1, 2, 3, 0], dtype=torch.uint8), 2).tolist() == [1 | 2 << 2 | 3 << 4]


def test_compress_pads_the_last_chunk_and_decompress_truncates():
    spec = CompressionSpec(numel=6, chunk=4, k=1, bits=2)
    x = torch.tensor([1.0, -4.0, 2.0, 0.0, 0.5, -0.25])
    c = compress(x, spec)
    assert c.idx.tolist() == [[1], [0]] and c.scale.tolist() == [4.0, 0.5]
    # a single kept value quantises to +-s exactly
    assert decompress(c, spec).tolist() == [0.0, -4.0, 0.0, 0.0, 0.5, 0.0]


def test_error_feedback_equations_by_hand():
    # chunk 4, k 1, 2-bit, beta 0.5
    ef = ErrorFeedback(CompressionSpec(numel=4, chunk=4, k=1, bits=2), beta=0.5)
    sent = decompress(ef.step(torch.tensor([1.0, -2.0, 0.5, 0.0])), ef.spec)
    # e = [1, -2, 0.5, 0]; top-1 is -2 (s = 2, code 0 -> -2); e <- [1, 0, 0.5, 0]
    assert sent.tolist() == [0.0, -2.0, 0.0, 0.0]
    assert ef.error.tolist() == [1.0, 0.0, 0.5, 0.0]
    sent = decompress(ef.step(torch.tensor([0.75, 0.0, 0.0, 0.0])), ef.spec)
    # e = 0.5 * [1, 0, 0.5, 0] + [0.75, 0, 0, 0] = [1.25, 0, 0.25, 0]; sends 1.25 at 0
    assert sent.tolist() == [1.25, 0.0, 0.0, 0.0]
    assert ef.error.tolist() == [0.0, 0.0, 0.25, 0.0]


def test_error_feedback_eventually_sends_everything():
    # with beta = 1 the sum of what was sent plus the buffer equals the sum of the inputs
    spec = CompressionSpec(numel=64, chunk=16, k=2, bits=4)
    ef = ErrorFeedback(spec, beta=1.0)
    g = torch.Generator().manual_seed(0)
    inputs = torch.zeros(64)
    sent = torch.zeros(64)
    for _ in range(20):
        d = torch.randn(64, generator=g)
        inputs += d
        sent += decompress(ef.step(d), spec)
    torch.testing.assert_close(sent + ef.error, inputs, rtol=0, atol=1e-5)


def test_error_feedback_state_roundtrip_and_shape_check():
    spec = CompressionSpec(numel=8, chunk=4, k=1, bits=2)
    a = ErrorFeedback(spec, 0.9)
    a.step(torch.arange(8.0))
    b = ErrorFeedback(spec, 0.9)
    b.load_state_dict(a.state_dict())
    d = torch.linspace(-1, 1, 8)
    assert torch.equal(decompress(a.step(d), spec), decompress(b.step(d), spec))
    with pytest.raises(ValueError, match="shape"):
        ErrorFeedback(CompressionSpec(numel=9, chunk=4, k=1, bits=2), 0.9).load_state_dict(a.state_dict())


def test_spec_sizes():
    spec = CompressionSpec(numel=10_000, chunk=4096, k=64, bits=2)
    assert spec.num_chunks == 3
    assert spec.body_bytes == 3 * 64 * 2 + 3 * 4 + 3 * 64 * 2 // 8


@pytest.mark.parametrize("kw, msg", [({"bits": 3}, "bits=3"), ({"k": 5}, "k=5"), ({"chunk": 1 << 17}, "chunk=")])
def test_spec_refuses_bad_values(kw, msg):
    args = {"numel": 16, "chunk": 4, "k": 2, "bits": 2} | kw
    with pytest.raises(ValueError, match=msg):
        CompressionSpec(**args)
