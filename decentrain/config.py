"""The composition root: the one place below the recipes that knows every schema.

Schemas live next to what they build (ModelConfig in models/, DataConfig in data/,
TrainConfig/LoopConfig in algorithms/common/config.py, OptimConfig and EngineConfig in
algorithms/common/engines/, LauncherConfig in core/, each algorithm's config in its
package). This module imports every loop algorithm (which registers it), converts
Hydra's resolved dict into those dataclasses once, and registers the schemas with
Hydra's ConfigStore. Nothing in decentrain/ imports it; recipes, tests and benchmarks do.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from omegaconf import OmegaConf

from decentrain.algorithms import ddp, diloco, noloco, sparseloco  # noqa: F401  (register "ddp", "diloco", "streaming_diloco", "noloco", "sparseloco")
from decentrain.algorithms.base import ALGORITHMS, algorithm_config
from decentrain.algorithms.common.config import LoopConfig, TrainConfig, check_data_fits, check_run_dir, validate
from decentrain.algorithms.common.engines import SCHEDULES, EngineConfig, OptimConfig
from decentrain.core.launch_config import LAUNCHERS, LauncherConfig
from decentrain.core.metrics import LoggerConfig
from decentrain.data.blocks import DataConfig
from decentrain.models.factory import ModelConfig

# callers above the library (recipes, tests, benchmarks) import the run's schemas from here
__all__ = ["LAUNCHERS", "SCHEDULES", "LauncherConfig", "LoopConfig", "OptimConfig", "TrainConfig", "check_data_fits",
           "check_run_dir", "config_from_dict", "register_configs", "register_hdee_configs", "validate"]


def _typed(cls: type, values: dict[str, Any], where: str):
    """Build dataclass `cls` from a plain dict; unknown keys and bad types fail naming the field."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(known)}")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), values))


def config_from_dict(raw: dict[str, Any]) -> TrainConfig:
    """The recipe's one conversion: a resolved plain dict (from Hydra) to typed dataclasses."""
    raw = dict(raw)
    algo_raw = dict(raw.pop("algorithm", None) or {"name": "ddp"})
    sections = {f.name: f for f in fields(TrainConfig)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ValueError(f"unknown top-level config key(s) {unknown}; allowed: {sorted(sections)}")
    kwargs: dict[str, Any] = {"algorithm": algorithm_config(algo_raw)}
    for name in ("model", "data", "logger", "launcher", "optim", "train", "engine"):
        cls = type(sections[name].default_factory())
        kwargs[name] = _typed(cls, dict(raw.get(name) or {}), name)
    for name in ("run_dir", "resume", "experiment"):
        if name in raw:
            kwargs[name] = raw[name]
    return TrainConfig(**kwargs)


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore; conf/ YAML files extend them (`<name>_schema`)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name in ALGORITHMS.names():
        cs.store(group="algorithm", name=f"{name}_schema", node=ALGORITHMS.get(name).config_cls)
    for group, cls in (("model", ModelConfig), ("data", DataConfig), ("logger", LoggerConfig), ("launcher", LauncherConfig),
                       ("engine", EngineConfig)):
        cs.store(group=group, name=f"{group}_schema", node=cls)


def register_hdee_configs() -> None:
    """Store `hdee_schema` (and the shared group schemas it composes) in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from decentrain.algorithms.hdee.config import HdeeConfig  # only the HDEE recipes pay for importing HDEE

    register_configs()  # model_schema, data_schema, logger_schema, launcher_schema
    ConfigStore.instance().store(name="hdee_schema", node=HdeeConfig)
