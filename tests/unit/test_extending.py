"""Extending decentrain: an engine, a pre-training algorithm and an outer optimizer are each one
module plus one YAML, picked up with no import list or registry edit (README, Extending). The
transport case is tests/unit/test_transports.py. Each example is put where the package and Hydra
look (an extra package directory, an extra conf directory) and trains from a composed config."""

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import decentrain.algorithms as algorithms
from decentrain.algorithms import diloco
from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.outer.optimizers import FIELD, OUTER_OPTIMIZERS, OuterOptimizerConfig, OuterRule
from decentrain.algorithms.outer.updates import OuterOptimizer
from decentrain.algorithms.pretraining import engines
from decentrain.algorithms.pretraining.engines import ENGINES
from decentrain.algorithms.pretraining.run import run_pretraining
from decentrain.config import config_from_dict, register_configs, validate
from decentrain.core.config_checks import check_range
from decentrain.core.registry import discover, discover_marked
from decentrain.core.world import World
from decentrain.testing import TINY

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()

ENGINE_MODULE = '''"""engine=torch_skip_nonfinite: engine=torch, but a step whose gradient norm is not finite is skipped
(an example entry)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decentrain.algorithms.pretraining.engines.base import ENGINES, EngineConfig
from decentrain.algorithms.pretraining.engines.torch import TorchEngine


@dataclass
class SkipNonFiniteConfig(EngineConfig):
    name: str = "torch_skip_nonfinite"
    max_skips: int = 10  # more skipped steps than this: raise (the run is diverging, not unlucky)


@ENGINES.register("torch_skip_nonfinite", config=SkipNonFiniteConfig)
class SkipNonFiniteEngine(TorchEngine):
    skipped = 0

    def step(self) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip or float("inf"))
        if not torch.isfinite(norm):
            self.skipped += 1
            if self.skipped > self.cfg.max_skips:
                raise RuntimeError(f"engine.max_skips={self.cfg.max_skips}: {self.skipped} non-finite gradients")
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
            return
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
'''
ENGINE_YAML = """# engine=torch that skips a step whose gradient norm is not finite
defaults:
  - torch_skip_nonfinite_schema
  - _self_
name: torch_skip_nonfinite
shards_per_replica: 1
max_skips: 10
"""
ALGORITHM_MODULE = '''"""Local SGD (Stich 2019): every H inner steps the replicas replace their weights by the mean
(an example entry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.inner_outer import InnerOuterAlgorithm, InnerOuterConfig


@dataclass
class LocalSGDConfig(InnerOuterConfig):
    name: str = "local_sgd"
    inner_steps: int = 8


@ALGORITHMS.register("local_sgd", config=LocalSGDConfig)
class LocalSGD(InnerOuterAlgorithm):
    cfg: LocalSGDConfig

    def setup(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]

    def outer_step(self, model: torch.nn.Module) -> dict[str, float]:
        mean = self.transport.start_mean(self.params).result()  # θ ← mean_i θ_i
        with torch.no_grad():
            for p, m in zip(self.params, mean):
                p.copy_(m)
        return {"outer/round": float(self.round + 1)}

    def outer_state(self) -> dict[str, Any]:
        return {}

    def load_outer_state(self, state: dict[str, Any]) -> None:
        pass
'''
ALGORITHM_YAML = """# Local SGD: H inner steps, then every replica takes the mean of the replicas' weights.
defaults:
  - local_sgd_schema
  - _self_
name: local_sgd
inner_steps: 8
"""
OUTER_YAML = """# RMSprop on the pseudo-gradient.
defaults:
  - rmsprop_schema
  - _self_
name: rmsprop
lr: 0.01
momentum: 0.0
alpha: 0.99
"""


# what adding an outer optimizer appends to decentrain/algorithms/outer/optimizers.py
@dataclass
class RMSpropConfig(OuterOptimizerConfig):
    name: str = "rmsprop"
    lr: float = 0.01
    alpha: float = 0.99  # smoothing of the squared pseudo-gradient; momentum is RMSprop's momentum


class RMSpropRule(OuterRule):
    """torch.optim.RMSprop on the pseudo-gradient (an example entry)."""

    @classmethod
    def check(cls, cfg: RMSpropConfig) -> None:
        super().check(cfg)
        check_range(f"{FIELD}.alpha", cfg.alpha, 0, 1, high_open=True)

    @classmethod
    def build(cls, params, cfg):
        return torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.alpha, momentum=cfg.momentum)


@pytest.fixture
def extensions(tmp_path):
    """The module files in extra directories of their packages, the YAMLs in an extra conf directory."""
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "torch_skip_nonfinite.py").write_text(ENGINE_MODULE)
    (tmp_path / "algos" / "diloco").mkdir(parents=True)
    (tmp_path / "algos" / "diloco" / "local_sgd.py").write_text(ALGORITHM_MODULE)
    for rel, text in (
        ("engine/torch_skip_nonfinite.yaml", ENGINE_YAML),
        ("algorithm/local_sgd.yaml", ALGORITHM_YAML),
        ("algorithm/outer_optimizer/rmsprop.yaml", OUTER_YAML),
    ):
        (tmp_path / "conf" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "conf" / rel).write_text(text)
    engines.__path__.append(str(tmp_path / "engines"))
    diloco.__path__.append(str(tmp_path / "algos" / "diloco"))
    try:
        # what importing the engines package and decentrain.config do for files in their directories
        assert discover(engines.__name__, [str(tmp_path / "engines")]) == ["torch_skip_nonfinite"]
        assert discover_marked(algorithms.__name__, tmp_path / "algos", ("@ALGORITHMS.register(",)) == [
            "diloco.local_sgd"
        ]
        OUTER_OPTIMIZERS.register("rmsprop", config=RMSpropConfig)(RMSpropRule)
        register_configs()  # each entry's <name>_schema, as every recipe does at import
        yield tmp_path / "conf"
    finally:
        engines.__path__.remove(str(tmp_path / "engines"))
        diloco.__path__.remove(str(tmp_path / "algos" / "diloco"))
        for registry, name in (
            (ENGINES, "torch_skip_nonfinite"),
            (ALGORITHMS, "local_sgd"),
            (OUTER_OPTIMIZERS, "rmsprop"),
        ):
            registry._entries.pop(name, None)
        for mod in (f"{engines.__name__}.torch_skip_nonfinite", f"{diloco.__name__}.local_sgd"):
            sys.modules.pop(mod, None)


def _compose(search: Path, *overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                *TINY,
                "run_dir=/tmp/x",
                "launcher.nproc_per_node=1",
                f"hydra.searchpath=[file://{search}]",
                *overrides,
            ],
        )
    return config_from_dict(OmegaConf.to_container(cfg, resolve=True))


def test_a_new_engine_and_algorithm_are_each_one_module_plus_one_yaml(extensions, tmp_path):
    cfg = _compose(
        extensions,
        "algorithm=local_sgd",
        "algorithm.inner_steps=2",
        "engine=torch_skip_nonfinite",
        "engine.max_skips=3",
        "train.steps=4",
        "train.eval_every=4",
        "train.checkpoint_every=100",
    )
    assert type(cfg.algorithm).__name__ == "LocalSGDConfig" and cfg.algorithm.inner_steps == 2
    assert type(cfg.engine).__name__ == "SkipNonFiniteConfig" and cfg.engine.max_skips == 3  # the engine's own field
    validate(cfg, 1)
    torch.set_num_threads(1)
    result = run_pretraining(cfg, World(), tmp_path / "run")
    assert result.final_step == 4 and result.train_loss < 6.0


def test_a_new_outer_optimizer_is_one_class_plus_one_yaml(extensions):
    cfg = _compose(
        extensions, "algorithm=diloco", "algorithm/outer_optimizer=rmsprop", "algorithm.outer_optimizer.alpha=0.9"
    )
    rule = cfg.algorithm.outer_optimizer
    assert type(rule) is RMSpropConfig and (rule.lr, rule.momentum, rule.alpha) == (0.01, 0.0, 0.9)
    assert isinstance(OuterOptimizer([torch.zeros(2)], rule).opt, torch.optim.RMSprop)
    with pytest.raises(ValueError, match=r"^algorithm.outer_optimizer.alpha=1.0 must be"):
        _compose(
            extensions, "algorithm=diloco", "algorithm/outer_optimizer=rmsprop", "algorithm.outer_optimizer.alpha=1.0"
        )
