"""core/registry.Registry: the one way a config section picks its entry and is typed by the entry's own class."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from decentrain.core.registry import Registry


@dataclass
class PartConfig:
    name: str = "plain"
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"part.size={self.size} must be >= 1")


@dataclass
class WideConfig(PartConfig):
    name: str = "wide"
    width: int = 4


PARTS: Registry[type] = Registry("part", config=PartConfig)


@PARTS.register("plain")
class Plain:
    config_cls = PartConfig


@PARTS.register("wide", config=WideConfig)
class Wide:
    pass


def test_register_sets_the_entry_config_class_and_lists_it():
    assert Wide.config_cls is WideConfig
    assert PARTS.configs() == {"plain": PartConfig, "wide": WideConfig}
    with pytest.raises(ValueError, match="part 'wide' registered twice"):
        PARTS.register("wide")(Plain)


def test_a_section_is_typed_by_its_entry_class():
    cfg = PARTS.config({"name": "wide", "width": 8})
    assert type(cfg) is WideConfig and cfg.width == 8 and cfg.size == 1
    assert type(PARTS.config({})) is PartConfig  # the base class's default name
    assert PARTS.config({"name": None}, default_name="wide").name == "wide"  # null: the caller's default


def test_instances_are_kept_when_typed_else_retyped():
    wide = WideConfig(width=2)
    assert PARTS.config(wide) is wide
    retyped = PARTS.config(PartConfig(name="wide", size=3))  # a base-class default naming an entry
    assert type(retyped) is WideConfig and retyped.size == 3 and retyped.width == 4


def test_fill_gives_the_fields_the_section_leaves_out():
    cfg = PARTS.config({"name": "wide"}, fill=PartConfig(size=5))
    assert (cfg.size, cfg.width) == (5, 4)
    assert PARTS.config({"name": "wide", "size": 2}, fill=PartConfig(size=5)).size == 2


@pytest.mark.parametrize(
    "raw, where, message",
    [
        ({"name": "tall"}, "part", r"^part.name='tall' is unknown; allowed: \['plain', 'wide'\]$"),
        ({"name": "tall"}, "job.part", r"^job.part.name='tall' is unknown"),
        (
            {"name": "plain", "width": 2},
            "job.part",
            r"^job.part: unknown field\(s\) \['width'\]; allowed: \['name', 'size'\]$",
        ),
        ({"size": 0}, "part", r"^part.size=0 must be >= 1$"),
        ({"size": 0}, "job.part", r"^job.part.size=0 must be >= 1$"),  # the entry's own check, relabelled
    ],
)
def test_errors_are_one_line_naming_the_field(raw, where, message):
    with pytest.raises(ValueError, match=message) as info:
        PARTS.config(raw, where)
    assert "\n" not in str(info.value)


def test_a_registry_without_config_class_types_nothing():
    with pytest.raises(TypeError, match="no config class"):
        Registry("reward").config({})


# -- the registries of a run, through the helper ------------------------------------------------------------


def test_an_engine_check_names_the_field_where_the_section_sits():
    from decentrain.algorithms.pretraining.engines import ENGINES

    with pytest.raises(ValueError, match=r"^engine.shards_per_replica=2 must be \[1, 1\]"):
        ENGINES.config({"name": "torch", "shards_per_replica": 2})
    with pytest.raises(ValueError, match=r"^job.engine.shards_per_replica=2 must be \[1, 1\]"):  # HDEE's job section
        ENGINES.config({"name": "torch", "shards_per_replica": 2}, where="job.engine")


def test_a_mistyped_value_is_one_line_naming_its_section():
    from decentrain.config import config_from_dict

    with pytest.raises(ValueError) as info:
        config_from_dict({"engine": {"name": "torch", "shards_per_replica": "two"}})
    assert str(info.value).startswith("engine: ") and "shards_per_replica" in str(info.value)


def test_a_recipe_refuses_a_bad_config_in_one_line():
    from recipes import config_errors

    with pytest.raises(SystemExit) as info:
        with config_errors():
            raise ValueError(
                "engine: Value 'two' of type 'str' could not be converted to Integer\n    full_key: shards_per_replica"
            )
    assert info.value.code == (
        "config error: engine: Value 'two' of type 'str' could not be converted to Integer full_key: shards_per_replica"
    )


def test_every_schema_is_stored_in_one_place():
    from decentrain.config import schemas

    paths = schemas("hdee", "sapo", "dei", own={"compare_schema": PartConfig})
    assert {
        "train_schema",
        "hdee_schema",
        "rl_schema",
        "sft_schema",
        "dei_schema",
        "compare_schema",
        "task/task_schema",
        "engine/deepspeed_schema",
        "algorithm/outer_optimizer/adam_schema",
    } <= set(paths)
    assert "rl_schema" not in schemas()  # SAPO's config (reasoning-gym) only for the recipes that ask
