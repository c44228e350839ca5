"""Thin Hydra entrypoints.

`conf_dir()` is where their YAML lives: the checkout's `conf/` (source tree, editable install) or
the copy a wheel installs as `decentrain/conf` (setup.py). `run(main, config_name)` starts one,
refusing a mistyped override key or group option first, in one line.
"""

import os
import sys
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def conf_dir() -> Path:
    source = Path(__file__).resolve().parents[1] / "conf"
    if (source / "config.yaml").is_file():
        return source
    import decentrain

    return Path(decentrain.__file__).resolve().parent / "conf"


def typed_config(dcfg, schema: type[T]) -> T:
    """The one conversion of a recipe whose config is one dataclass: Hydra's config merged onto `schema`
    (its `__post_init__` checks run here; a bad value raises ValueError naming the field)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(dcfg, resolve=True)))


def run(main: Callable[[], None], config_name: str) -> None:
    if "LOCAL_RANK" not in os.environ:  # workers under torchrun: their launcher checked the same command line
        from decentrain.config import check_overrides

        problem = check_overrides(conf_dir(), config_name, sys.argv[1:])
        if problem is not None:
            sys.exit(f"config error: {problem}")
    main()
