"""HDEE experts merged into one routed model: the closed-form ridge router and the routed causal LM."""

import pytest
import torch

from decentrain.algorithms.hdee.router import RouterStats, fit_router, ridge_weights, route
from decentrain.core.comm.ensemble import token_logprobs
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_seq_len=64)


def _data(seed=0, n=(40, 30, 50), d=6):
    g = torch.Generator().manual_seed(seed)
    # class i sits along its own direction (the router has no bias column: a linear map through 0)
    return {
        f"c{i}": torch.randn(k, d, generator=g, dtype=torch.float64) + 3 * torch.eye(d, dtype=torch.float64)[i]
        for i, k in enumerate(n)
    }


def _lstsq(h: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Ridge as an ordinary least-squares problem on [H; sqrt(λ) I] against [Y; 0]."""
    d = h.shape[1]
    a = torch.cat([h, lam**0.5 * torch.eye(d, dtype=h.dtype)])
    b = torch.cat([y, torch.zeros(d, y.shape[1], dtype=y.dtype)])
    return torch.linalg.lstsq(a, b).solution


def _fit_direct(data: dict, experts: list[str], lam: float) -> torch.Tensor:
    h = torch.cat(list(data.values()))
    y = torch.cat(
        [torch.tensor([[float(c == e) for e in experts]] * len(x), dtype=torch.float64) for c, x in data.items()]
    )
    return _lstsq(h, y, lam)


def _stats(data: dict) -> RouterStats:
    s = RouterStats()
    for c, x in data.items():
        for part in x.split(7):  # accumulated in pieces: sums of per-row outer products
            s.add(c, part)
    return s


def test_router_closed_form_equals_a_direct_lstsq_solve():
    data = _data()
    w = fit_router(_stats(data), list(data), lam=0.5)
    assert torch.allclose(w, _fit_direct(data, list(data), 0.5), atol=1e-9)
    h = torch.cat(list(data.values()))
    assert torch.allclose(
        ridge_weights(h.T @ h, h.T @ torch.ones(len(h), 1, dtype=h.dtype), 0.5),
        _lstsq(h, torch.ones(len(h), 1, dtype=h.dtype), 0.5),
        atol=1e-9,
    )
    # The classes here are separable: the router sends most rows to their own class.
    acc = [(route(x, w) == i).double().mean().item() for i, x in enumerate(data.values())]
    assert min(acc) > 0.8


def test_removing_an_expert_equals_a_refit_on_the_remaining():
    data = _data(1)
    s = _stats(data)
    full = fit_router(s, ["c0", "c1", "c2"], lam=0.3)
    # Its text stays in the calibration pool: the other columns do not move, and equal a refit with c1's targets gone.
    kept = fit_router(s, ["c0", "c2"], lam=0.3)
    assert torch.equal(kept, full[:, [0, 2]])
    assert torch.allclose(kept, _fit_direct(data, ["c0", "c2"], 0.3), atol=1e-9)
    # Its text leaves too: a refit on the remaining classes' data only.
    s.remove("c1")
    rest = {k: v for k, v in data.items() if k != "c1"}
    assert torch.allclose(fit_router(s, ["c0", "c2"], lam=0.3), _fit_direct(rest, ["c0", "c2"], 0.3), atol=1e-9)


def test_adding_an_expert_reads_only_its_own_text_and_equals_a_refit():
    data = _data(2)
    s = _stats({k: data[k] for k in ("c0", "c1")})
    before = {k: v.clone() for k, v in s.gram.items()}
    s.add("c2", data["c2"])
    assert all(torch.equal(s.gram[k], before[k]) for k in before)  # the others' statistics are untouched
    assert torch.allclose(fit_router(s, list(data), lam=1.0), _fit_direct(data, list(data), 1.0), atol=1e-9)


def test_router_refuses_an_expert_without_statistics():
    with pytest.raises(ValueError, match=r"no calibration statistics for experts \['zz'\]"):
        fit_router(_stats(_data()), ["c0", "zz"], lam=1.0)


def _models(n: int):
    tok = build_tokenizer(TINY)
    out = []
    for i in range(n):
        torch.manual_seed(10 + i)
        out.append(build_model(TINY, tok).eval())
    return tok, out


def _routed(n_experts=2, pooling="running_mean"):
    from decentrain.algorithms.hdee.routed import merge

    tok, (backbone, *experts) = _models(n_experts + 1)
    g = torch.Generator().manual_seed(0)
    # Two "domains" the backbone can tell apart: low bytes and high bytes.
    calib = {f"e{i}": torch.randint(3 + 100 * i, 60 + 100 * i, (6, 16), generator=g) for i in range(n_experts)}
    model = merge(backbone, {f"e{i}": m for i, m in enumerate(experts)}, calib, ridge_lambda=1e-2, pooling=pooling)
    return tok, backbone, experts, calib, model


def test_routed_logprobs_equal_the_expert_where_routing_is_perfect():
    _, _, experts, calib, model = _routed()
    with torch.no_grad():
        for i, blocks in enumerate(calib.values()):
            assert (model.choices(blocks) == i).all()  # every token of domain i goes to expert i
            assert torch.equal(token_logprobs(model, blocks), token_logprobs(experts[i], blocks))
            assert model.experts_run(blocks).tolist() == [1.0] * len(blocks)


def test_routed_model_round_trips_through_save_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    from decentrain.algorithms.hdee.routed import RoutedExpertsForCausalLM

    _, _, _, calib, model = _routed(pooling="token")
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert (tmp_path / "model.safetensors").exists()
    x = torch.cat(list(calib.values()))
    for loaded in (
        RoutedExpertsForCausalLM.from_pretrained(tmp_path),
        AutoModelForCausalLM.from_pretrained(tmp_path),
        build_model(ModelConfig(pretrained=str(tmp_path))),
    ):
        assert isinstance(loaded, RoutedExpertsForCausalLM)
        assert loaded.config.expert_names == ["e0", "e1"] and loaded.config.pooling == "token"
        assert torch.equal(loaded.router_weight, model.router_weight)
        with torch.no_grad():
            assert torch.equal(loaded(input_ids=x).logits, model(input_ids=x).logits)


def test_add_and_remove_expert_equal_a_merge_of_the_remaining():
    from decentrain.algorithms.hdee.routed import merge

    _, backbone, experts, calib, model = _routed(n_experts=3)
    w = model.router_weight.clone()
    model.remove_expert("e1")  # its text stays in HᵀH: the others' router columns do not move
    assert model.config.expert_names == ["e0", "e2"] and len(model.experts) == 2
    assert torch.equal(model.router_weight, w[:, [0, 2]])
    # Its text leaves too: the same router as merging the remaining two from scratch.
    _, _, _, _, dropped = _routed(n_experts=3)
    dropped.remove_expert("e1", drop_calibration=True)
    two = merge(
        backbone, {"e0": experts[0], "e2": experts[2]}, {"e0": calib["e0"], "e2": calib["e2"]}, ridge_lambda=1e-2
    )
    assert torch.allclose(dropped.router_weight, two.router_weight, atol=1e-10)
    x = torch.cat(list(calib.values()))
    with torch.no_grad():
        assert torch.equal(dropped(input_ids=x).logits, two(input_ids=x).logits)
    # Adding e1 back reads only e1's text and gives the three-expert router (columns in the new order).
    gram = two.router_gram.clone()
    two.add_expert("e1", experts[1], calib["e1"])
    assert torch.equal(two.router_gram[:2], gram)
    assert torch.allclose(two.router_weight, w[:, [0, 2, 1]], atol=1e-10)
    with pytest.raises(ValueError, match="already in the routed model"):
        two.add_expert("e1", experts[1], calib["e1"])


def test_recalibrating_for_another_pooling_equals_a_merge_with_it():
    from decentrain.algorithms.hdee.routed import merge

    _, backbone, experts, calib, model = _routed(pooling="running_mean")
    model.recalibrate(calib, "token")
    fresh = merge(backbone, {"e0": experts[0], "e1": experts[1]}, calib, ridge_lambda=1e-2, pooling="token")
    assert model.config.pooling == "token" and torch.allclose(model.router_weight, fresh.router_weight, atol=1e-10)
