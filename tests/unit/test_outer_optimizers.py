"""The outer-optimizer registry: each rule against hand-computed numbers, NoLoCo's bit for bit
against the paper's function, config refusals in one line, and exact resume."""

from __future__ import annotations

import pytest
import torch

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.diloco import DiLoCoConfig, StreamingDiLoCo, StreamingDiLoCoConfig
from decentrain.algorithms.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.outer.optimizers import (
    OUTER_OPTIMIZERS,
    AdamConfig,
    OuterOptimizerConfig,
    SGDConfig,
)
from decentrain.algorithms.outer.updates import OuterOptimizer, noloco_step_
from decentrain.core.world import World


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def test_heavy_ball_sgd_two_steps() -> None:
    # φ = [1, -2], Δ̄ = [0.4, -0.8] then [0.1, 0.2]; η = 0.7, μ = 0.9, no Nesterov:
    # step 1: b = Δ̄ = [0.4, -0.8];  φ = [1, -2] − 0.7·b = [0.72, -1.44]
    # step 2: b = 0.9·[0.4, -0.8] + [0.1, 0.2] = [0.46, -0.52];  φ = [0.72, -1.44] − 0.7·b = [0.398, -1.076]
    outer = OuterOptimizer([t(1.0, -2.0)], SGDConfig(lr=0.7, momentum=0.9, nesterov=False))
    outer.step([t(0.4, -0.8)])
    torch.testing.assert_close(outer.slow[0], t(0.72, -1.44), rtol=0, atol=1e-6)
    outer.step([t(0.1, 0.2)])
    torch.testing.assert_close(outer.slow[0], t(0.398, -1.076), rtol=0, atol=1e-6)


def test_adam_first_steps_move_each_coordinate_by_lr() -> None:
    # bias-corrected first step: m̂ = g, v̂ = g², so φ ← φ − η·g/|g| = φ − η·sign(g)  (eps 1e-8 aside)
    outer = OuterOptimizer([t(1.0, -2.0)], OuterOptimizerConfig("adam", lr=0.01, momentum=0.9))
    outer.step([t(0.4, -0.8)])
    torch.testing.assert_close(outer.slow[0], t(0.99, -1.99), rtol=0, atol=1e-6)
    # the same gradient again: m̂ = g and v̂ = g² still, so another η·sign(g)
    outer.step([t(0.4, -0.8)])
    torch.testing.assert_close(outer.slow[0], t(0.98, -1.98), rtol=0, atol=1e-6)


def test_noloco_rule_is_the_papers_step_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(3)
    phi0 = torch.randn(5, 7, generator=g)
    ref_phi, ref_theta, ref_m = [phi0.clone()], [phi0.clone()], [torch.zeros_like(phi0)]
    outer = OuterOptimizer([phi0.clone()], OuterOptimizerConfig("noloco", lr=0.7, momentum=0.5))
    theta = [phi0.clone()]
    for _ in range(4):
        theta_bar = phi0 + torch.randn(5, 7, generator=g)  # the pair's mean fast weights this round
        noloco_step_(ref_phi, ref_theta, ref_m, [theta_bar], lr=0.7, momentum=0.5)
        outer.step(outer.pseudo_gradient([theta_bar]))  # g = φ − θ̄
        outer.copy_to(theta)
        assert torch.equal(outer.slow[0], ref_phi[0]) and torch.equal(theta[0], ref_theta[0])
        assert torch.equal(outer.opt.buffers()[0], ref_m[0])


@pytest.mark.parametrize(
    "cfg",
    [
        SGDConfig(lr=0.7, momentum=0.9, nesterov=True),
        SGDConfig(lr=0.5, momentum=0.8, nesterov=False),
        OuterOptimizerConfig("noloco", 0.7, 0.5),
        AdamConfig(lr=0.01, momentum=0.9),
    ],
    ids=lambda c: f"{c.name}-{getattr(c, 'nesterov', None)}",
)
def test_every_rule_resumes_exactly(cfg) -> None:
    a = OuterOptimizer([t(1.0, -2.0, 0.5)], cfg)
    a.step([t(0.4, -0.8, 0.1)])
    b = OuterOptimizer([torch.zeros(3)], cfg)
    b.load_state_dict(a.state_dict())
    for outer in (a, b):
        outer.step([t(0.1, 0.2, -0.3)])
    assert torch.equal(a.slow[0], b.slow[0])  # the momentum came along


def test_resuming_under_another_outer_optimizer_is_refused() -> None:
    a = OuterOptimizer([t(1.0)], OuterOptimizerConfig("sgd"))
    with pytest.raises(ValueError, match="algorithm.outer_optimizer.name='noloco' differs from the checkpoint's 'sgd'"):
        OuterOptimizer([t(1.0)], OuterOptimizerConfig("noloco", momentum=0.5)).load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "lion"}, "algorithm.outer_optimizer.name='lion' is unknown; allowed: "),
        ({"lr": 0.0}, "algorithm.outer_optimizer.lr=0.0 must be a finite number in (0, 4]"),
        ({"lr": float("nan")}, "algorithm.outer_optimizer.lr=nan must be"),
        ({"momentum": 1.0}, "algorithm.outer_optimizer.momentum=1.0 must be a finite number in [0, 1)"),
        (
            {"momentum": 0.0, "nesterov": True},
            "algorithm.outer_optimizer.nesterov=true needs algorithm.outer_optimizer.momentum > 0",
        ),
        # each rule owns its fields: another rule's key is refused, naming the rule's own
        (
            {"name": "noloco", "nesterov": False},
            "algorithm.outer_optimizer: unknown field(s) ['nesterov']; allowed: ['lr', 'momentum', 'name']",
        ),
        (
            {"name": "sgd", "beta2": 0.99},
            "algorithm.outer_optimizer: unknown field(s) ['beta2']; allowed: ['lr', 'momentum', 'name', 'nesterov']",
        ),
        ({"name": "noloco", "momentum": -0.1}, "algorithm.outer_optimizer.momentum=-0.1 must be"),
        ({"name": "adam", "lr": 1.5}, "algorithm.outer_optimizer.lr=1.5 must be a finite number in (0, 1]"),
        ({"name": "adam", "beta2": 1.0}, "algorithm.outer_optimizer.beta2=1.0 must be a finite number in [0, 1)"),
    ],
)
def test_bad_values_fail_in_one_line_naming_field_and_range(kwargs, message) -> None:
    with pytest.raises(ValueError) as e:
        OuterOptimizerConfig.convert(kwargs)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_every_family_takes_the_section_and_the_old_flat_keys_fail_naming_the_new_one() -> None:
    assert DiLoCoConfig().outer_optimizer == SGDConfig(lr=0.7, momentum=0.9, nesterov=True)
    assert NoLoCoConfig().outer_optimizer == OuterOptimizerConfig("noloco", 0.7, 0.5)
    for old, new in (("outer_lr", "lr"), ("outer_momentum", "momentum"), ("nesterov", "nesterov")):
        with pytest.raises(ValueError, match=rf"^algorithm.{old} was removed; use algorithm.outer_optimizer.{new} \("):
            ALGORITHMS.config({"name": "diloco", old: 0.5})
    with pytest.raises(
        ValueError, match=r"^job.algorithm.outer_lr was removed; use job.algorithm.outer_optimizer.lr \("
    ):
        ALGORITHMS.config({"name": "noloco", "outer_lr": 0.5}, where="job.algorithm")
    with pytest.raises(ValueError, match="algorithm.gamma=0.2 .* allowed: algorithm.outer_optimizer.name=noloco"):
        NoLoCoConfig(gamma=0.2, outer_optimizer=OuterOptimizerConfig("sgd"))


def test_streaming_diloco_builds_one_outer_optimizer_per_fragment() -> None:
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"num_hidden_layers": 2})()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([Layer(), Layer()])

    cfg = StreamingDiLoCoConfig(
        inner_steps=2, num_fragments=2, overlap_steps=0, outer_optimizer=SGDConfig(lr=0.5, momentum=0.9, nesterov=False)
    )
    algo = StreamingDiLoCo(cfg, World())
    algo.on_train_start(Model(), None)
    assert len(algo.outers) == 2
    assert all(isinstance(o.opt, torch.optim.SGD) and o.opt.defaults["nesterov"] is False for o in algo.outers)


def test_noloco_runs_any_registered_rule_on_its_own_drift() -> None:
    # alone, θ̄ = θ: g = φ − θ = 1 − 3 = −2; heavy-ball SGD, η = 0.5: φ = 1 − 0.5·(−2) = 2
    model = torch.nn.Linear(1, 1, bias=False)
    model.weight.data.fill_(1.0)
    algo = NoLoCo(NoLoCoConfig(inner_steps=1, outer_optimizer=SGDConfig(lr=0.5, momentum=0.5, nesterov=False)), World())
    algo.on_train_start(model, None)
    model.weight.data.fill_(3.0)
    algo.after_optimizer_step(1, model, None)
    assert model.weight.item() == pytest.approx(2.0)
    assert set(OUTER_OPTIMIZERS.names()) >= {"sgd", "noloco", "adam"}


@pytest.mark.parametrize("choice", ["nesterov", "heavy_ball", "noloco", "adam"])
def test_every_outer_optimizer_yaml_composes_into_every_family(choice) -> None:
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from decentrain.config import config_from_dict, register_configs

    register_configs()
    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        for algorithm in ("diloco", "streaming_diloco", "noloco"):
            raw = compose("config", overrides=[f"algorithm={algorithm}", f"algorithm/outer_optimizer={choice}"])
            cfg = config_from_dict({"algorithm": OmegaConf.to_container(raw.algorithm, resolve=True)})
            values = OmegaConf.to_container(OmegaConf.load(conf / "algorithm/outer_optimizer" / f"{choice}.yaml"))
            values.pop("defaults")
            assert cfg.algorithm.outer_optimizer == OuterOptimizerConfig.convert(values)
            assert type(cfg.algorithm.outer_optimizer) is OUTER_OPTIMIZERS.get(values["name"]).config_cls


@pytest.mark.parametrize(
    "rule", [OuterOptimizerConfig("noloco", 0.7, 0.5), AdamConfig(lr=0.01, momentum=0.9)], ids=lambda c: c.name
)
def test_noloco_outer_state_resumes_bit_for_bit(rule) -> None:
    def replica():
        model = torch.nn.Linear(3, 1, bias=False)
        model.weight.data.copy_(t(1.0, -2.0, 0.5))
        algo = NoLoCo(NoLoCoConfig(inner_steps=1, outer_optimizer=rule), World())
        return model, algo

    (a_model, a), (b_model, b) = replica(), replica()
    a.on_train_start(a_model, None)
    a_model.weight.data.add_(t(0.3, 0.1, -0.2))
    a.after_optimizer_step(1, a_model, None)
    b_model.load_state_dict(a_model.state_dict())
    b.load_state_dict(a.state_dict())
    b.on_train_start(b_model, None)
    for algo, model in ((a, a_model), (b, b_model)):
        model.weight.data.add_(t(-0.1, 0.4, 0.2))
        algo.after_optimizer_step(2, model, None)
    assert torch.equal(a_model.weight, b_model.weight) and torch.equal(a.phi[0], b.phi[0])


# -- a section without `name` keeps its algorithm's rule (issue 40 item 5) ---------------------------
# Since 26b7c6d an `outer_optimizer` section given without `name` was typed with the base class's own
# default name, sgd: NoLoCo silently stepped Nesterov SGD. On g = 1 from φ = 0, η = 0.7, μ = 0.5:
#   NoLoCo's rule  m ← μ·m − η·g ; φ ← φ + m :    φ = −0.7, then −0.7 + (−0.35 − 0.7) = −1.75
#   Nesterov SGD   b ← μ·b + g ; φ ← φ − η·(g + μ·b): φ = −1.05, then −1.05 − 0.7·1.75 = −2.275


def two_outer_steps_on_unit_gradient(cfg) -> float:
    outer = OuterOptimizer([torch.zeros(1)], cfg)
    for _ in range(2):
        outer.step([torch.ones(1)])
    return outer.slow[0].item()


def hydra_algorithm(*overrides: str):
    """The `algorithm` section the train recipe types from `conf/` with these overrides."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from decentrain.config import config_from_dict, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        raw = compose("config", overrides=list(overrides))
    return config_from_dict({"algorithm": OmegaConf.to_container(raw.algorithm, resolve=True)}).algorithm


def follow_the_removed_key_message(family: str, old: str, value: float):
    """What a user does with `algorithm.<old> was removed; use algorithm.<new> (...)`: writes <new> instead."""
    with pytest.raises(ValueError) as e:
        ALGORITHMS.config({"name": family, old: value})
    new = str(e.value).split("; use algorithm.", 1)[1].split(" ", 1)[0]  # e.g. outer_optimizer.lr
    section, key = new.split(".")
    return ALGORITHMS.config({"name": family, section: {key: value}})


NOLOCO_SPELLINGS = {
    "config_from_dict": lambda: (
        __import__("decentrain.config", fromlist=["config_from_dict"])
        .config_from_dict({"algorithm": {"name": "noloco", "outer_optimizer": {"lr": 0.7}}})
        .algorithm
    ),
    "dataclass_dict": lambda: NoLoCoConfig(outer_optimizer={"lr": 0.7}),
    "dataclass_unnamed_section": lambda: NoLoCoConfig(outer_optimizer=OuterOptimizerConfig(lr=0.7, momentum=0.5)),
    "hdee_job_algorithm": lambda: ALGORITHMS.config(
        {"name": "noloco", "outer_optimizer": {"lr": 0.7}}, where="job.algorithm"
    ),
    "hydra_override": lambda: hydra_algorithm("algorithm=noloco", "algorithm.outer_optimizer.lr=0.7"),
    "hydra_section_override": lambda: hydra_algorithm("algorithm=noloco", "algorithm.outer_optimizer={lr: 0.7}"),
    "removed_key_message": lambda: follow_the_removed_key_message("noloco", "outer_lr", 0.7),
}


@pytest.mark.parametrize("spelling", list(NOLOCO_SPELLINGS))
def test_noloco_section_without_name_steps_noloco_rule(spelling) -> None:
    cfg = NOLOCO_SPELLINGS[spelling]().outer_optimizer
    assert cfg.name == "noloco"
    assert two_outer_steps_on_unit_gradient(cfg) == pytest.approx(-1.75, abs=1e-6)  # Nesterov SGD: -2.275


def test_a_section_naming_another_rule_still_switches() -> None:
    cfg = NoLoCoConfig(outer_optimizer={"name": "sgd", "lr": 0.7, "momentum": 0.5}).outer_optimizer
    assert type(cfg) is SGDConfig and cfg.nesterov
    assert two_outer_steps_on_unit_gradient(cfg) == pytest.approx(-2.275, abs=1e-6)
    assert OuterOptimizer([t(0.0)], OuterOptimizerConfig(lr=0.7)).cfg.name == "sgd"  # outside any algorithm: sgd


# every family with an outer optimizer, η = 0.5 given without `name`, two steps on g = 1 from φ = 0:
#   diloco, streaming_diloco: Nesterov μ = 0.9:  φ = −0.5·1.9 = −0.95, then −0.95 − 0.5·(1 + 0.9·1.9) = −2.305
#   noloco: μ = 0.5:  m = −0.5, φ = −0.5; m = −0.25 − 0.5, φ = −1.25
#   sparseloco: plain SGD, μ = 0:  φ = −0.5, then −1.0
FAMILY_PHI = {"diloco": -2.305, "streaming_diloco": -2.305, "noloco": -1.25, "sparseloco": -1.0}


def test_every_family_with_an_outer_optimizer_is_checked() -> None:
    from decentrain.algorithms.base import ALGORITHMS
    from decentrain.config import LOOP_ALGORITHM_MODULES  # noqa: F401  (registers every loop algorithm)

    with_outer = {
        n for n in ALGORITHMS.names() if "outer_optimizer" in ALGORITHMS.get(n).config_cls.__dataclass_fields__
    }
    assert with_outer == set(FAMILY_PHI)


@pytest.mark.parametrize("family", list(FAMILY_PHI))
@pytest.mark.parametrize("spelling", ["dict", "dataclass", "hydra"])
def test_every_family_keeps_its_rule_on_every_spelling(family, spelling) -> None:
    from decentrain.algorithms.base import ALGORITHMS
    from decentrain.config import config_from_dict

    if spelling == "dict":
        algo = config_from_dict({"algorithm": {"name": family, "outer_optimizer": {"lr": 0.5}}}).algorithm
    elif spelling == "dataclass":
        default = ALGORITHMS.get(family).config_cls().outer_optimizer
        algo = ALGORITHMS.get(family).config_cls(
            outer_optimizer=OuterOptimizerConfig(lr=0.5, momentum=default.momentum)
        )
    else:
        algo = hydra_algorithm(f"algorithm={family}", "algorithm.outer_optimizer.lr=0.5")
    assert algo.outer_optimizer.name == ALGORITHMS.get(family).config_cls().outer_optimizer.name
    assert two_outer_steps_on_unit_gradient(algo.outer_optimizer) == pytest.approx(FAMILY_PHI[family], abs=1e-6)


def test_noloco_rule_kept_as_an_ordinary_user() -> None:
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "test_noloco_section_without_name_steps_noloco_rule")
