"""Thin Hydra entrypoints, all opened the same way:

    @recipe("rl", "sapo")             # the schemas registered, `main` the Hydra app of conf/rl.yaml
    def main(dcfg: DictConfig) -> None:
        with config_errors():         # a bad config: one `config error: ...` line, before anything starts
            cfg = to_config(dcfg)
        ...

    if __name__ == "__main__":
        run(main)                     # a mistyped override key or group option refused first, in one line

`conf_dir()` is where their YAML lives: the checkout's `conf/` (source tree, editable install) or
the copy a wheel installs as `decentrain/conf` (setup.py).
"""

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

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


def recipe(
    config_name: str, *families: str, own: dict[str, type] | None = None
) -> Callable[[Callable], Callable[[], None]]:
    """The recipes' shared opening, a decorator of `main(dcfg)`: the schemas conf/ extends registered in
    Hydra's ConfigStore (decentrain.config.register_configs, with the `families` whose top-level schemas the
    recipe composes and the recipe's `own`), and `main` made the Hydra app of conf_dir()'s `config_name`."""
    import hydra

    from decentrain.config import register_configs

    register_configs(*families, own=own)

    def deco(main: Callable) -> Callable[[], None]:
        app = hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name=config_name)(main)
        app.config_name = config_name  # what run() checks the command line against
        return app

    return deco


@contextmanager
def config_errors(*more: type[Exception]) -> Iterator[None]:
    """A bad config raised inside (ValueError, or one of `more`) ends the command with one line,
    `config error: <field>...`, before any process, process group or peer starts."""
    try:
        yield
    except (ValueError, *more) as e:
        sys.exit("config error: " + " ".join(str(e).split()))


def run(main: Callable[[], None], config_name: str | None = None) -> None:
    """Start a recipe's Hydra app (`config_name`: the one `recipe` gave it unless said)."""
    config_name = config_name or main.config_name
    if "LOCAL_RANK" not in os.environ:  # workers under torchrun: their launcher checked the same command line
        from decentrain.config import check_overrides

        problem = check_overrides(conf_dir(), config_name, sys.argv[1:])
        if problem is not None:
            sys.exit(f"config error: {problem}")
    main()
