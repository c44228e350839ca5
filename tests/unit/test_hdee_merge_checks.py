"""HDEE merges and loads only whole, finite, compatible models of a size that fits (issue 40 item 4).

Each attack is a tampered save_pretrained directory or config value; each is refused with a
ValueError of one line naming the model and what is wrong, before the router is fit (before any
weights are read, where the config alone tells). Only modules that existed at 78c329b are imported
at the top, so that each test fails there on its own finding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import ByT5Tokenizer

from decentrain.algorithms.hdee import routed
from decentrain.algorithms.hdee.merge import ExpertSource, MergeConfig, build_routed
from decentrain.algorithms.hdee.routed import RoutedExpertsConfig, RoutedExpertsForCausalLM, merge
from decentrain.data.blocks import DataConfig
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, hf_config, save_model
from decentrain.testing import rerun_unprivileged
from recipes import typed_config

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_seq_len=64)
DATA = DataConfig(domains=["licenses", "arithmetic"], seq_len=32, max_bytes_per_domain=12_000)
WEIGHTS = "model.safetensors"


def _save(path: Path, seed: int, tokenizer=None, model_tokenizer=None) -> str:
    """A tiny random model saved with `tokenizer` (default the byte tokenizer), its vocabulary `model_tokenizer`'s."""
    tokenizer = tokenizer or build_tokenizer(TINY)
    torch.manual_seed(seed)
    save_model(build_model(TINY, model_tokenizer or tokenizer), tokenizer, path)
    return str(path)


@pytest.fixture
def sources(tmp_path) -> MergeConfig:
    """A backbone and two experts, a and b (licenses, arithmetic), all whole and compatible."""
    return MergeConfig(
        backbone=_save(tmp_path / "seed", 0),
        data=DATA,
        calibration_blocks=2,
        batch_size=2,
        experts=[
            ExpertSource("a", _save(tmp_path / "a", 1), ["licenses"]),
            ExpertSource("b", _save(tmp_path / "b", 2), ["arithmetic"]),
        ],
    )


def _tamper(model_dir: str | Path, change) -> None:
    """Rewrite `model_dir`'s safetensors file through `change(tensors)`."""
    path = Path(model_dir) / WEIGHTS
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _refused(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError, match=match) as e:
        fn(*args, **kwargs)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


@pytest.fixture
def no_router_fit(monkeypatch):
    """The router is never fit: refusals come first."""

    def fit(*a, **k):
        raise AssertionError("the router was fit")

    monkeypatch.setattr(routed, "fit_router", fit)


# -- whole: missing, unexpected or mis-shaped tensors (transformers initialises, drops, or raises) --


def _drop_half(tensors: dict) -> None:
    for k in sorted(tensors)[::2]:
        del tensors[k]


def _add_one(tensors: dict) -> None:
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4)


def _reshape_one(tensors: dict) -> None:
    tensors["model.norm.weight"] = torch.ones(16)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            _drop_half,
            r"^experts\[1\] \(b\): 6 tensor\(s\) missing: lm_head.weight, model.layers.0.input_layernorm.weight, ",
        ),
        (_add_one, r"^experts\[1\] \(b\): 1 tensor\(s\) unexpected: model.layers.0.mlp.extra_proj.weight$"),
        (_reshape_one, r"^experts\[1\] \(b\): 1 tensor\(s\) of another shape: model.norm.weight$"),
    ],
    ids=["missing", "unexpected", "mis-shaped"],
)
def test_an_expert_that_is_not_whole_is_refused_naming_its_tensors(sources, no_router_fit, change, match) -> None:
    _tamper(sources.experts[1].path, change)
    _refused(match, build_routed, sources)


@pytest.mark.parametrize("which", ["backbone", "expert"])
def test_non_finite_weights_are_refused_naming_the_tensor(sources, no_router_fit, which) -> None:
    def poison(tensors):
        tensors["model.norm.weight"][3] = float("nan")
        tensors["lm_head.weight"][0, 0] = float("inf")

    _tamper(sources.backbone if which == "backbone" else sources.experts[0].path, poison)
    where = "backbone" if which == "backbone" else r"expert 'a'"
    _refused(rf"^{where}: 2 tensor\(s\) hold NaN or inf: lm_head.weight, model.norm.weight$", build_routed, sources)


# -- compatible: one vocabulary and one tokenizer, checked from the configs before any weights ----------


def test_an_expert_of_another_vocabulary_is_refused_before_any_weights(
    sources, no_router_fit, tmp_path, monkeypatch
) -> None:
    other = ByT5Tokenizer()
    other.add_tokens(["<domain>"])  # one token more: 385 rows of embedding, the backbone has 384
    sources.experts[1].path = _save(tmp_path / "other_vocab", 3, other)
    monkeypatch.setattr(routed.RoutedExpertsForCausalLM, "calibrate", lambda *a, **k: pytest.fail("calibrated"))
    _refused(r"^experts\[1\] \(b\): vocab_size=385, the backbone's is 384$", build_routed, sources)


def test_an_expert_saved_with_another_tokenizer_is_refused(sources, no_router_fit, tmp_path) -> None:
    # the same 384-row embedding, but its tokenizer maps ids to other tokens: its logits mean other text
    sources.experts[0].path = _save(tmp_path / "other_tok", 3, ByT5Tokenizer(extra_ids=50), build_tokenizer(TINY))
    _refused(
        r"^experts\[0\] \(a\): its tokenizer \(ByT5Tokenizer, 309 tokens\) is not the backbone's "
        r"\(ByT5Tokenizer, 384 tokens\)$",
        build_routed,
        sources,
    )


def test_merge_refuses_models_of_another_vocabulary(sources) -> None:
    other = ByT5Tokenizer()
    other.add_tokens(["<domain>"])
    backbone, expert = build_model(TINY, build_tokenizer(TINY)), build_model(TINY, other)
    _refused(
        r"^expert 'x': vocab_size=385, the backbone's is 384$",
        merge,
        backbone,
        {"x": expert},
        {"x": torch.randint(0, 300, (2, 8))},
    )


# -- sources: a missing directory is one line, not a transformers traceback ------------------------------


@pytest.mark.parametrize("which", ["backbone", "expert"])
def test_a_missing_source_is_one_line(sources, tmp_path, which) -> None:
    if which == "backbone":
        sources.backbone = str(tmp_path / "no_such_seed")
        match = rf"^backbone={tmp_path}/no_such_seed: no such directory"
    else:
        sources.experts[1].path = str(tmp_path / "no_such_expert")
        match = rf"^experts\[1\].path={tmp_path}/no_such_expert: no such directory"
    _refused(match, build_routed, sources)


# -- merge values, refused before work starts ----------------------------------------------------------


@pytest.mark.parametrize(
    "values, match",
    [
        ({"ridge_lambda": float("nan")}, r"^ridge_lambda=nan must be a finite number in \(0, inf\)$"),
        ({"ridge_lambda": float("inf")}, r"^ridge_lambda=inf must be a finite number in \(0, inf\)$"),
        ({"batch_size": 0}, r"^batch_size=0 must be >= 1$"),
        (
            {
                "experts": [
                    {"name": "a", "path": "x", "domains": ["licenses"]},
                    {"name": "a", "path": "y", "domains": ["arithmetic"]},
                ]
            },
            r"^experts\[1\].name='a' names two experts; each expert needs its own name$",
        ),
    ],
    ids=["ridge_nan", "ridge_inf", "batch_0", "one_name_twice"],
)
def test_bad_merge_values_are_refused_in_one_line(values, match) -> None:
    raw = {"backbone": "seed", "experts": [{"name": "a", "path": "x", "domains": ["licenses"]}], **values}
    _refused(match, typed_config, raw, MergeConfig)  # the recipe's one conversion


def test_router_layer_naming_no_hidden_state_is_refused_before_any_weights(sources, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights read"))
    sources.router_layer = 999
    _refused(
        r"^router_layer=999 names no hidden state of the backbone \(1 layers: allowed -2 to 1\)$", build_routed, sources
    )


def test_whole_finite_compatible_sources_still_merge(sources) -> None:
    model, _ = build_routed(sources)
    assert model.config.expert_names == ["a", "b"] and torch.isfinite(model.router_weight).all()


# -- routed configs: sizes capped before allocating; routed checkpoints loaded whole and finite ----------


def _part(vocab_size: int = 384, **fields) -> dict:
    return hf_config(TINY, vocab_size, **fields).to_diff_dict() | {"model_type": "llama"}


@pytest.mark.parametrize(
    "backbone, experts, match",
    [
        (
            _part(vocab_size=2**40),
            [_part(vocab_size=2**40)],
            r"^routed config: its config names \d+\.\d GiB of tensors, more than the ",
        ),
        (
            _part(),
            [_part(vocab_size=2**40)],
            r"^routed config: experts\[0\]: vocab_size=1099511627776, the backbone's is 384$",
        ),
        (
            _part(num_hidden_layers=2000),
            [_part()],
            r"^routed config: backbone: num_hidden_layers=2000 must be an integer in ",
        ),
        (_part(), [_part()] * 300, r"^routed config: 300 experts and 0 calibration classes; at most 256"),
        ({"model_type": "no_such_model"}, [_part()], r"^routed config: backbone: not a config transformers can build "),
    ],
    ids=["huge_vocab", "other_vocab", "layers", "experts", "unknown_type"],
)
def test_a_routed_config_is_measured_and_capped_before_allocating(backbone, experts, match) -> None:
    cfg = RoutedExpertsConfig(backbone=backbone, experts=experts, expert_names=[f"e{i}" for i in range(len(experts))])
    _refused(match, RoutedExpertsForCausalLM, cfg)


@pytest.fixture
def routed_dir(sources, tmp_path) -> Path:
    model, tokenizer = build_routed(sources)
    return save_model(model, tokenizer, tmp_path / "routed")


def test_a_routed_checkpoint_naming_a_huge_size_is_refused_before_allocating(routed_dir) -> None:
    config = json.loads((routed_dir / "config.json").read_text())
    config["experts"][1]["intermediate_size"] = 2**40
    (routed_dir / "config.json").write_text(json.dumps(config))
    _refused(
        r"^routed config: its config names \d+\.\d GiB of tensors",
        RoutedExpertsForCausalLM.from_pretrained,
        str(routed_dir),
    )


@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda t: [t.pop(k) for k in sorted(t) if k.startswith("experts.1.")],
            r"^routed model .*: 1[12] tensor\(s\) missing: experts.1.",
        ),
        (
            lambda t: t["experts.0.model.norm.weight"].fill_(float("nan")),
            r"^routed model .*: 1 tensor\(s\) hold NaN or inf: experts.0.model.norm.weight$",
        ),
        (
            lambda t: t.__setitem__("router_weight", torch.full_like(t["router_weight"], float("inf"))),
            r"^routed model .*: 1 tensor\(s\) hold NaN or inf: router_weight$",
        ),
    ],
    ids=["missing_expert_tensors", "nan_expert", "inf_router"],
)
def test_a_routed_checkpoint_is_loaded_whole_and_finite(routed_dir, change, match) -> None:
    _tamper(routed_dir, change)
    _refused(match, RoutedExpertsForCausalLM.from_pretrained, str(routed_dir))
    _refused(match, build_model, ModelConfig(pretrained=str(routed_dir)))  # the library's ordinary loader too


# -- hdee_train's budget ----------------------------------------------------------------------------------


@pytest.mark.parametrize("tolerance", [float("nan"), float("inf")])
def test_budget_tolerance_must_be_a_finite_non_negative_number(tmp_path, tolerance) -> None:
    from omegaconf import OmegaConf

    from decentrain.algorithms.hdee.compute_budget import check_budget
    from decentrain.algorithms.hdee.config import baseline_plan, hdee_config_from_dict
    from decentrain.testing import tiny_hdee_config

    cfg = tiny_hdee_config(tmp_path)
    raw = OmegaConf.to_container(OmegaConf.structured(cfg))
    raw["budget"]["tolerance"] = tolerance
    # hdee_train's
    _refused(rf"^budget.tolerance={tolerance} must be a finite number in \[0, inf\)$", hdee_config_from_dict, raw)
    _refused(
        rf"^tolerance={tolerance} must be", check_budget, cfg.plan, baseline_plan(cfg), hf_config(TINY, 384), tolerance
    )


def test_every_refusal_holds_as_an_ordinary_user() -> None:
    rerun_unprivileged(__file__, "not ordinary_user and not still_merge")
