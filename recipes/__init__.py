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
    """A recipe's one conversion: Hydra's config (or its resolved dict) typed as `schema` by
    decentrain.core.typed, which every recipe's conversion ends in (registry-picked sections take their
    entry's own config class; `__post_init__` checks run; a bad value raises ValueError naming the field)."""
    from omegaconf import DictConfig, OmegaConf

    from decentrain.core.typed import typed

    return typed(schema, OmegaConf.to_container(dcfg, resolve=True) if isinstance(dcfg, DictConfig) else dict(dcfg))


def run(main: Callable[[], None], config_name: str) -> None:
    if "LOCAL_RANK" not in os.environ:  # workers under torchrun: their launcher checked the same command line
        from decentrain.config import check_overrides

        problem = check_overrides(conf_dir(), config_name, sys.argv[1:])
        if problem is not None:
            sys.exit(f"config error: {problem}")
    main()
