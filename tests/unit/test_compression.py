"""Top-k + b-bit compression with error feedback, against hand-computed numbers."""

import pytest
import torch

from decentrain.algorithms.outer.compression import (
    CompressionSpec,
    ErrorFeedback,
    compress,
    decompress,
    pack_codes,
    sent_mask,
    topk_per_chunk,
    unpack_codes,
)
from decentrain.algorithms.outer.sparse_quantizers import MaxAbs, Statistical

quantize_symmetric, dequantize_symmetric = MaxAbs.quantize, MaxAbs.dequantize


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
    spec = CompressionSpec.flat(numel=6, chunk=4, k=1, bits=2)
    x = torch.tensor([1.0, -4.0, 2.0, 0.0, 0.5, -0.25])
    c = compress(x, spec)
    assert c.idx[0].tolist() == [[1], [0]] and c.params[0].tolist() == [4.0, 0.5]
    # a single kept value quantises to +-s exactly
    assert decompress(c, spec).tolist() == [0.0, -4.0, 0.0, 0.0, 0.5, 0.0]


def test_error_feedback_equations_by_hand():
    # chunk 4, k 1, 2-bit, beta 0.5
    ef = ErrorFeedback(CompressionSpec.flat(numel=4, chunk=4, k=1, bits=2), beta=0.5)
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
    spec = CompressionSpec.flat(numel=64, chunk=16, k=2, bits=4)
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
    spec = CompressionSpec.flat(numel=8, chunk=4, k=1, bits=2)
    a = ErrorFeedback(spec, 0.9)
    a.step(torch.arange(8.0))
    b = ErrorFeedback(spec, 0.9)
    b.load_state_dict(a.state_dict())
    d = torch.linspace(-1, 1, 8)
    assert torch.equal(decompress(a.step(d), spec), decompress(b.step(d), spec))
    with pytest.raises(ValueError, match="shape"):
        ErrorFeedback(CompressionSpec.flat(numel=9, chunk=4, k=1, bits=2), 0.9).load_state_dict(a.state_dict())


def test_spec_sizes():
    spec = CompressionSpec.flat(numel=10_000, chunk=4096, k=64, bits=2)
    assert spec.groups[0].n == 3
    assert spec.body_bytes == 3 * 64 * 2 + 3 * 4 + 3 * 64 * 2 // 8


@pytest.mark.parametrize("kw, msg", [({"bits": 3}, "bits=3"), ({"k": 5}, "k=5"), ({"chunk": 1 << 17}, "chunk=")])
def test_spec_refuses_bad_values(kw, msg):
    args = {"numel": 16, "chunk": 4, "k": 2, "bits": 2} | kw
    with pytest.raises(ValueError, match=msg):
        CompressionSpec.flat(**args)


def _rel_sq_error(q, vals, bits=2):
    codes, params = q.quantize(vals, bits)
    return ((q.dequantize(codes, params, bits) - vals).pow(2).sum() / vals.pow(2).sum()).item()


def test_statistical_quantizer_matches_the_reference_on_the_kept_values():
    """The top-64 of a normal 4096-vector (two clusters, ±): ~1 % relative squared error; max-abs ~13 %.
    One spike among small values: the spike gets a bin of its own; max-abs rounds the small ones to ±s/3."""
    g = torch.Generator().manual_seed(0)
    errs = []
    for _ in range(20):
        _, vals = topk_per_chunk(torch.randn(1, 4096, generator=g), 64)
        errs.append((_rel_sq_error(Statistical, vals), _rel_sq_error(MaxAbs, vals)))
    stat, maxabs = (sum(e) / len(e) for e in zip(*errs))
    assert 0.005 < stat < 0.025 and maxabs > 0.1
    spike = torch.cat([torch.tensor([100.0]), 0.01 * torch.randn(63, generator=g)])[None, :]
    assert _rel_sq_error(Statistical, spike) < 1e-3 and _rel_sq_error(MaxAbs, spike) > 1.0


def test_statistical_codes_decode_to_their_bin_means():
    # mean 0, σ = ‖c‖/√3 = √(2·9 + 2·1)/√3; s = 6σ/4; codes round(c/s + 2): -3 -> 0, -1 -> 1, 1 -> 3?, 3 -> 3
    vals = torch.tensor([[-3.0, -1.0, 1.0, 3.0]])
    codes, params = Statistical.quantize(vals, 2)
    s = 6 * (20 / 3) ** 0.5 / 4
    assert codes.tolist() == [[round(-3 / s + 2), round(-1 / s + 2), round(1 / s + 2), min(3, round(3 / s + 2))]]
    decoded = Statistical.dequantize(codes, params, 2)
    for code in set(codes.flatten().tolist()):  # each code decodes to the mean of the values that got it
        in_bin = codes == code
        assert torch.allclose(decoded[in_bin], vals[in_bin].mean().expand(int(in_bin.sum())))
    assert params[0].item() == 0.0 and params.numel() == 5


def test_statistical_single_or_equal_values_come_back_exactly():
    for vals in (torch.tensor([[0.7]]), torch.full((2, 3), -0.25)):
        codes, params = Statistical.quantize(vals, 2)
        assert torch.equal(Statistical.dequantize(codes, params, 2), vals)


def test_tiles_of_a_matrix_are_two_d_blocks_and_k_scales_with_the_tile():
    spec = CompressionSpec.tiled([(128, 96), (100,)], k=64, bits=2)
    (w, b) = spec.groups
    assert (w.n, w.length, w.k) == (4, 64 * 48, 48) and (b.n, b.length, b.k) == (2, 50, 1)
    grid = torch.arange(128 * 96).view(128, 96)
    assert w.positions[1].tolist() == grid[:64, 48:].reshape(-1).tolist()  # tile (0, 1): rows 0-63, columns 48-95
    assert b.positions[1].tolist() == list(range(128 * 96 + 50, 128 * 96 + 100))
    x = torch.zeros(spec.numel)
    x[grid[70, 50]] = 5.0  # inside tile (1, 1)
    c = compress(x, spec)
    assert decompress(c, spec)[grid[70, 50]] == 5.0 and sent_mask(c, spec).sum() == spec.kept
