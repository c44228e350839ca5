"""The composition root: the one place below the recipes that knows every schema.

Schemas live next to what they build (ModelConfig in models/, DataConfig in data/,
TrainConfig/LoopConfig in algorithms/pretraining/config.py, OptimConfig and EngineConfig in
algorithms/pretraining/engines/, LauncherConfig in core/launch/, each algorithm's config in its
package). This module imports every loop algorithm (found by its registration, which it runs), converts
Hydra's resolved dict into those dataclasses once, and registers every recipe's schemas with Hydra's
ConfigStore (register_configs: the one place; SAPO's, HDEE's and DEI's only for the recipes that ask).
Nothing in decentrain/ imports it; recipes, tests and benchmarks do.
"""

from __future__ import annotations

import difflib
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Mapping

from omegaconf import OmegaConf

import decentrain.algorithms as algorithms
from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.outer.optimizers import OUTER_OPTIMIZERS
from decentrain.algorithms.pretraining.config import LoopConfig, TrainConfig, check_data_fits, check_run_dir, validate
from decentrain.algorithms.pretraining.engines import ENGINES, SCHEDULES, OptimConfig
from decentrain.algorithms.pretraining.transports import TRANSPORTS
from decentrain.core.launch.config import LAUNCHERS, LauncherConfig
from decentrain.core.metrics import LoggerConfig
from decentrain.core.registry import Registry, discover_marked
from decentrain.core.typed import renamed_key, typed
from decentrain.data.blocks import DataConfig
from decentrain.models.factory import ModelConfig

# every loop algorithm registers itself: the modules under algorithms/ that use the decorator are imported
# (ddp, diloco, streaming_diloco, noloco, sparseloco); adding one is a module plus conf/algorithm/<name>.yaml
LOOP_ALGORITHM_MODULES = discover_marked(
    algorithms.__name__, Path(algorithms.__file__).parent, ("@ALGORITHMS.register(",)
)

# callers above the library (recipes, tests, benchmarks) import the run's schemas from here
__all__ = [
    "LAUNCHERS",
    "SCHEDULES",
    "LauncherConfig",
    "LoopConfig",
    "OptimConfig",
    "TrainConfig",
    "check_data_fits",
    "check_overrides",
    "check_run_dir",
    "config_from_dict",
    "register_configs",
    "schemas",
    "validate",
]


def config_from_dict(raw: dict[str, Any]) -> TrainConfig:
    """The recipe's one conversion: a resolved plain dict (from Hydra) to typed dataclasses (core/typed.py)."""
    raw = dict(raw)
    sections = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(raw) - sections)
    if unknown:
        raise ValueError(f"unknown top-level config key(s) {unknown}; allowed: {sorted(sections)}")
    raw["algorithm"] = dict(raw.get("algorithm") or {"name": "ddp"})
    return typed(TrainConfig, raw)


# conf/<group>/*.yaml extend `<group>_schema`
GROUP_SCHEMAS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "logger": LoggerConfig}
# conf/<group>/<name>.yaml extends `<name>_schema`, the config class of entry <name> of the group's registry
REGISTRY_GROUPS: dict[str, Registry] = {
    "algorithm": ALGORITHMS,
    "algorithm/outer_optimizer": OUTER_OPTIMIZERS,
    "engine": ENGINES,
    "transport": TRANSPORTS,
    "launcher": LAUNCHERS,
}

# the top-level schemas of the other recipes, by family: each imported only by the recipes that ask for it
# (SAPO's config pulls in reasoning-gym, ~1.8 s that `decentrain train` should not pay)
FAMILY_SCHEMAS: Registry[Callable[[], dict[str, type]]] = Registry("schema family")


@FAMILY_SCHEMAS.register("hdee")
def _hdee_schemas() -> dict[str, type]:
    from decentrain.algorithms.hdee.config import HdeeConfig

    return {"hdee_schema": HdeeConfig}


@FAMILY_SCHEMAS.register("sapo")
def _sapo_schemas() -> dict[str, type]:
    from decentrain.algorithms.sapo.config import SAPOConfig, SFTConfig
    from decentrain.tasks import TaskMixConfig

    return {"rl_schema": SAPOConfig, "sft_schema": SFTConfig, "task/task_schema": TaskMixConfig}


@FAMILY_SCHEMAS.register("dei")
def _dei_schemas() -> dict[str, type]:
    from decentrain.algorithms.dei.config import DEIConfig

    return {"dei_schema": DEIConfig}


def schemas(*families: str, own: Mapping[str, type] | None = None) -> dict[str, type]:
    """Every schema conf/ extends, by its ConfigStore path (`[<group>/]<name>_schema`): `train_schema`, the
    shared groups', each registry entry's, the top-level schemas of `families` (FAMILY_SCHEMAS), and `own`,
    a recipe's own schemas whose classes live beside it (recipes/compare.py's compare_schema)."""
    out: dict[str, type] = {"train_schema": TrainConfig}
    out |= {f"{group}/{group}_schema": cls for group, cls in GROUP_SCHEMAS.items()}
    for group, registry in REGISTRY_GROUPS.items():
        out |= {f"{group}/{name}_schema": cls for name, cls in registry.configs().items()}
    for family in families:
        out |= FAMILY_SCHEMAS.get(family, field="register_configs family")()
    return {**out, **(own or {})}


def register_configs(*families: str, own: Mapping[str, type] | None = None) -> None:
    """Store the schemas in Hydra's ConfigStore, the one place they are registered; conf/ YAML files extend
    them (`defaults: [<name>_schema]`). A recipe calls it once at import, naming the families whose top-level
    schemas it composes beyond `train_schema` (`register_configs("sapo")` for rl_schema and sft_schema)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for path, node in schemas(*families, own=own).items():
        group, _, name = path.rpartition("/")
        cs.store(group=group or None, name=name, node=node)


def _group_options(conf_dir: Path, group: str) -> list[str]:
    """The YAML options of config group `group` (`a/b` nests); ConfigStore `*_schema` entries are not options."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _close(word: str, choices: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.5)
    return f"did you mean {' or '.join(prefix + c for c in close)}? " if close else ""


def _unknown_key(tree: Any, key: str) -> str | None:
    """Why `key` (dotted) names nothing in the composed config `tree` (plain containers), or None."""
    node, done = tree, []
    for part in key.split("."):
        if isinstance(node, list):
            return None  # list entries (nodes.0.model) are checked by their schema
        if not isinstance(node, dict):
            return f"{'.'.join(done)} is a value, not a section" if done else None
        if part not in node:
            where = ".".join(done)
            names = sorted(str(k) for k in node)
            return (
                f"{key} is not a config key; {_close(part, names, where + '.' if where else '')}"
                f"{where + ' has' if where else 'top-level keys are'}: {', '.join(names)}"
            )
        node, done = node[part], [*done, part]
    return None


def check_overrides(conf_dir: Path, config_name: str, args: list[str]) -> str | None:
    """One line naming a mistyped override key or group option (close matches first), or None.

    Hydra's own answers point the wrong way for a typo: an unknown key gets "use +train.stepz=10"
    (which adds the typo), an unknown option lists the `*_schema` entries of the ConfigStore. Keys
    are checked against the config composed with the command's group choices, so an algorithm's own
    keys exist when `algorithm=` picks it. `+key=` / `++key=` / `~key` are Hydra's explicit forms and
    pass; so does anything Hydra itself would reject for syntax (its message says where).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in args):
        return None  # --cfg, --config-name, ...: Hydra's own modes
    try:
        parsed = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    except Exception:  # noqa: BLE001 -- a syntax error: Hydra reports it with the position
        return None
    choices, keys = [], []
    for o in parsed:
        key = o.key_or_group
        if key.split(".")[0].split("/")[0] == "hydra" or o.is_add() or o.is_force_add() or o.is_delete():
            continue
        if (conf_dir / key).is_dir():
            options = _group_options(conf_dir, key)
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for v in values:
                if v not in options and v != "null":
                    return f"{key}={v} is not an option; {_close(v, options)}options: {', '.join(options)}"
            choices.append(f"{o.get_key_element()}={values[0]}")
        elif "/" not in key:
            keys.append(key)
    if not keys:
        return None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(conf_dir), version_base="1.3"):
            tree = OmegaConf.to_container(compose(config_name, overrides=choices), resolve=False)
    except Exception:  # noqa: BLE001 -- whatever fails to compose, Hydra reports in its own run
        return None
    finally:
        GlobalHydra.instance().clear()
    return next((why for why in map(lambda k: _removed_key(tree, k) or _unknown_key(tree, k), keys) if why), None)


def _removed_key(tree: Any, key: str) -> str | None:
    """`<section>.<old>` for a key the composed section's config class renamed or moved (`algorithm.outer_lr`,
    `launcher.replicas`): the one line naming the new key."""
    section, _, rest = key.partition(".")
    node = tree.get(section) if isinstance(tree, dict) else None
    registry = REGISTRY_GROUPS.get(section)
    if registry is None or not isinstance(node, dict) or node.get("name") not in registry:
        return None
    return renamed_key(registry.config_cls(node["name"]), [rest.split(".")[0]], section)
