"""Outer updates against hand-computed numbers (worked out in the comments)."""

from __future__ import annotations

import pytest
import torch

from decentrain.algorithms.outer.updates import (
    OuterOptimizer,
    OuterOptimizerConfig,
    check_fragments_cover,
    dequantize,
    fragment_param_names,
    mean_dequantized,
    mix_,
    noloco_general_step_,
    noloco_step_,
    pseudo_gradient,
    quantize,
    strided_fragments,
)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- DiLoCo


def test_pseudo_gradient_is_prev_minus_local() -> None:
    (d,) = pseudo_gradient([t(1.0, -2.0)], [t(0.5, -1.0)])
    close(d, t(0.5, -1.0))


def test_diloco_outer_nesterov_two_steps() -> None:
    # θ_prev = [1, -2]; replicas end the round at a = [0.5, -1.0], b = [0.7, -1.4].
    # Δa = [0.5, -1.0], Δb = [0.3, -0.6]  ->  Δ̄ = [0.4, -0.8].
    model = [t(1.0, -2.0)]
    outer = OuterOptimizer(model, OuterOptimizerConfig(lr=0.7, momentum=0.9))
    da = outer.pseudo_gradient([t(0.5, -1.0)])
    db = outer.pseudo_gradient([t(0.7, -1.4)])
    avg = [(x + y) / 2 for x, y in zip(da, db)]
    close(avg[0], t(0.4, -0.8))

    # Step 1: b = Δ̄ ; update = Δ̄ + 0.9·b = 1.9·Δ̄ = [0.76, -1.52]
    #         θ = [1, -2] − 0.7·[0.76, -1.52] = [0.468, -0.936]
    outer.step(avg)
    close(outer.slow[0], t(0.468, -0.936))
    outer.copy_to(model)
    close(model[0], t(0.468, -0.936))

    # Step 2 with Δ̄ = [0.1, 0.2]: b = 0.9·[0.4, -0.8] + [0.1, 0.2] = [0.46, -0.52]
    #         update = [0.1, 0.2] + 0.9·[0.46, -0.52] = [0.514, -0.268]
    #         θ = [0.468, -0.936] − 0.7·[0.514, -0.268] = [0.1082, -0.7484]
    outer.step([t(0.1, 0.2)])
    close(outer.slow[0], t(0.1082, -0.7484))


def test_outer_optimizer_keeps_fp32_slow_weights_and_resumes_exactly() -> None:
    model = [torch.tensor([1.0, -2.0], dtype=torch.bfloat16)]
    a = OuterOptimizer(model)
    assert a.slow[0].dtype == torch.float32
    a.step([t(0.4, -0.8)])

    b = OuterOptimizer([torch.zeros(2)])
    b.load_state_dict(a.state_dict())
    a.step([t(0.1, 0.2)])
    b.step([t(0.1, 0.2)])
    torch.testing.assert_close(a.slow[0], b.slow[0], rtol=0, atol=0)  # momentum came along too

    with pytest.raises(ValueError, match="shape"):
        OuterOptimizer([torch.zeros(3)]).load_state_dict(a.state_dict())


# ----------------------------------------------------------------------------- Streaming DiLoCo


def test_strided_fragments() -> None:
    assert strided_fragments(6, 3) == [[0, 3], [1, 4], [2, 5]]
    assert strided_fragments(5, 2) == [[0, 2, 4], [1, 3]]
    assert strided_fragments(4, 1) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="num_fragments"):
        strided_fragments(4, 5)
    with pytest.raises(ValueError, match="num_fragments"):
        strided_fragments(4, 0)


LLAMA_NAMES = [
    "model.embed_tokens.weight",
    *[
        f"model.layers.{i}.{p}.weight"
        for i in range(4)
        for p in ("self_attn.q_proj", "mlp.down_proj", "input_layernorm")
    ],
    "model.norm.weight",
    "lm_head.weight",
]


def test_fragment_param_names_llama() -> None:
    frags = fragment_param_names(LLAMA_NAMES, num_layers=4, num_fragments=2)
    # Layers 0, 2 -> fragment 0 (with embeddings); layers 1, 3 -> fragment 1 (with norm and head).
    assert "model.embed_tokens.weight" in frags[0]
    assert {"model.norm.weight", "lm_head.weight"} <= set(frags[1])
    assert "model.layers.2.mlp.down_proj.weight" in frags[0]
    assert "model.layers.3.self_attn.q_proj.weight" in frags[1]
    assert sorted(n for f in frags for n in f) == sorted(LLAMA_NAMES)


def test_fragment_param_names_real_hf_model() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    names = [n for n, _ in transformers.LlamaForCausalLM(cfg).named_parameters()]
    frags = fragment_param_names(names, num_layers=3, num_fragments=3)
    check_fragments_cover(frags, names)
    assert "model.embed_tokens.weight" in frags[0] and "model.norm.weight" in frags[2]


def test_fragments_reject_bad_cover() -> None:
    with pytest.raises(ValueError, match="no fragment"):
        fragment_param_names([*LLAMA_NAMES, "model.vision_tower.weight"], 4, 2)
    with pytest.raises(ValueError, match="layer 4"):
        fragment_param_names([*LLAMA_NAMES, "model.layers.4.mlp.up_proj.weight"], 4, 2)
    with pytest.raises(ValueError, match="in fragments 0 and 0"):
        fragment_param_names([*LLAMA_NAMES, "model.embed_tokens.weight"], 4, 2)
    with pytest.raises(ValueError, match="do not cover"):
        check_fragments_cover([["a"], ["b"]], ["a", "b", "c"])
    with pytest.raises(ValueError, match="in fragments 0 and 1"):
        check_fragments_cover([["a", "b"], ["b"]], ["a", "b"])
    with pytest.raises(ValueError, match="lacks"):
        check_fragments_cover([["a"], ["z"]], ["a"])


def test_mix() -> None:
    local = [t(1.0, 2.0)]
    mix_(local, [t(3.0, 0.0)], alpha=0.5)  # 0.5·[1, 2] + 0.5·[3, 0]
    close(local[0], t(2.0, 1.0))
    local = [t(1.0, 2.0)]
    mix_(local, [t(3.0, 0.0)], alpha=0.25)  # 0.25·[1, 2] + 0.75·[3, 0]
    close(local[0], t(2.5, 0.5))


def test_quantize_none_and_fp16() -> None:
    x = t(0.5, -1.25, 3.0).view(3, 1)
    for kind, dtype in (("none", torch.float32), ("fp16", torch.float16)):
        (payload,) = quantize(x, kind)
        assert payload.dtype == dtype and payload.shape == (3,)
        y = dequantize((payload,), kind, x.shape)
        assert y.dtype == torch.float32
        close(y, x)  # exactly representable in fp16


def test_quantize_int4_hand_computed() -> None:
    # chunk 4. Chunk 0 = [0, 1.5, 3, 0.75]: min 0, scale 3/15 = 0.2,
    #   codes = round([0, 7.5, 15, 3.75]) = [0, 8, 15, 4]  ->  [0, 1.6, 3.0, 0.8]
    # Chunk 1 = [10, 10, 10, 10]: scale 0, codes 0, exact.
    # Chunk 2 = [-1, 2] padded with 2: min -1, scale 0.2, codes [0, 15, 15, 15], exact.
    x = t(0.0, 1.5, 3.0, 0.75, 10.0, 10.0, 10.0, 10.0, -1.0, 2.0)
    packed, scale, lo = quantize(x, "int4", chunk=4)
    assert packed.dtype == torch.uint8
    # Two codes per byte, low nibble first: 0|8<<4, 15|4<<4, 0, 0, 0|15<<4, 15|15<<4
    assert packed.tolist() == [128, 79, 0, 0, 240, 255]
    close(scale, t(0.2, 0.0, 0.2))
    close(lo, t(0.0, 10.0, -1.0))
    y = dequantize((packed, scale, lo), "int4", x.shape, chunk=4)
    close(y, t(0.0, 1.6, 3.0, 0.8, 10.0, 10.0, 10.0, 10.0, -1.0, 2.0))


def test_int4_error_bound_and_fp32_mean() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 70, generator=g), torch.randn(5, 70, generator=g)
    pa, pb = quantize(a, "int4", chunk=64), quantize(b, "int4", chunk=64)
    # Error is at most half a step of the chunk's scale.
    assert (dequantize(pa, "int4", a.shape, chunk=64) - a).abs().max() <= pa[1].max() / 2 + 1e-6
    mean = mean_dequantized([pa, pb], "int4", a.shape, chunk=64)
    assert mean.dtype == torch.float32
    assert (mean - (a + b) / 2).abs().max() <= max(pa[1].max(), pb[1].max()) / 2 + 1e-6
    with pytest.raises(ValueError, match="quantization"):
        quantize(a, "int8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk"):
        quantize(a, "int4", chunk=7)


# ----------------------------------------------------------------------------- NoLoCo

# Replica i and its partner j (group G = {i, j}) at outer step 1:
#   φ_i = [1.0, 2.0], θ_i = [0.8, 2.4];  φ_j = [1.2, 1.6], θ_j = [1.0, 1.8]
#   θ̄_G = [0.9, 2.1];  mean φ = [1.1, 1.8]
#   Δ_i = φ_i − θ_i = [0.2, -0.4];  Δ_j = [0.2, -0.2];  mean Δ = [0.2, -0.3]


def test_noloco_step_two_rounds() -> None:
    phi, theta, m = [t(1.0, 2.0)], [t(0.8, 2.4)], [torch.zeros(2)]
    # m = 0.5·0 + 0.7·([0.9, 2.1] − [1.0, 2.0]) = [-0.07, 0.07];  φ = [0.93, 2.07]
    noloco_step_(phi, theta, m, [t(0.9, 2.1)], lr=0.7, momentum=0.5)
    close(m[0], t(-0.07, 0.07))
    close(phi[0], t(0.93, 2.07))
    close(theta[0], phi[0])
    # Round 2 with θ̄_G = [0.83, 2.17]:
    # m = 0.5·[-0.07, 0.07] + 0.7·([0.83, 2.17] − [0.93, 2.07]) = [-0.105, 0.105];  φ = [0.825, 2.175]
    noloco_step_(phi, theta, m, [t(0.83, 2.17)], lr=0.7, momentum=0.5)
    close(m[0], t(-0.105, 0.105))
    close(phi[0], t(0.825, 2.175))


def test_noloco_general_form_equals_simple_form_when_beta_eq_gamma() -> None:
    phi, theta, delta = [t(1.0, 2.0)], [t(0.8, 2.4)], [torch.zeros(2)]
    # δ = 0 − 0.7·[0.2, -0.3] − 0.7·([1.0, 2.0] − [1.1, 1.8]) = −0.7·[0.1, -0.1] = [-0.07, 0.07]
    noloco_general_step_(phi, theta, delta, [t(0.2, -0.3)], [t(1.1, 1.8)], alpha=0.5, beta=0.7, gamma=0.7)
    close(delta[0], t(-0.07, 0.07))
    close(phi[0], t(0.93, 2.07))
    close(theta[0], phi[0])
    # Round 2: θ_i = [0.73, 2.27], φ_j = [1.13, 1.73], θ_j = [0.93, 2.07]  (θ̄_G = [0.83, 2.17])
    #   mean φ = [1.03, 1.90];  Δ_i = [0.2, -0.2], Δ_j = [0.2, -0.34], mean Δ = [0.2, -0.27]
    #   δ = 0.5·[-0.07, 0.07] − 0.7·[0.2, -0.27] − 0.7·([0.93, 2.07] − [1.03, 1.90])
    #     = [-0.035, 0.035] − [0.14, -0.189] − [-0.07, 0.119] = [-0.105, 0.105]   (same as above)
    theta[0].copy_(t(0.73, 2.27))
    noloco_general_step_(phi, theta, delta, [t(0.2, -0.27)], [t(1.03, 1.90)], alpha=0.5, beta=0.7, gamma=0.7)
    close(delta[0], t(-0.105, 0.105))
    close(phi[0], t(0.825, 2.175))


def test_noloco_forms_coincide_on_random_tensors() -> None:
    g = torch.Generator().manual_seed(1)
    phi_i, phi_j, theta_i, theta_j, m0 = (torch.randn(3, 4, generator=g) for _ in range(5))
    a_phi, a_theta, a_m = [phi_i.clone()], [theta_i.clone()], [m0.clone()]
    noloco_step_(a_phi, a_theta, a_m, [(theta_i + theta_j) / 2], lr=0.7, momentum=0.5)
    b_phi, b_theta, b_d = [phi_i.clone()], [theta_i.clone()], [m0.clone()]
    mean_pg = ((phi_i - theta_i) + (phi_j - theta_j)) / 2
    noloco_general_step_(b_phi, b_theta, b_d, [mean_pg], [(phi_i + phi_j) / 2], alpha=0.5, beta=0.7, gamma=0.7)
    torch.testing.assert_close(a_phi[0], b_phi[0])
    torch.testing.assert_close(a_m[0], b_d[0])


def test_noloco_general_form_beta_ne_gamma() -> None:
    phi, theta, delta = [t(1.0, 2.0)], [t(0.8, 2.4)], [torch.zeros(2)]
    # β = 0.7, γ = 0.35: δ = −0.7·[0.2, -0.3] − 0.35·[-0.1, 0.2] = [-0.14, 0.21] + [0.035, -0.07] = [-0.105, 0.14]
    noloco_general_step_(phi, theta, delta, [t(0.2, -0.3)], [t(1.1, 1.8)], alpha=0.5, beta=0.7, gamma=0.35)
    close(delta[0], t(-0.105, 0.14))
    close(phi[0], t(0.895, 2.14))
