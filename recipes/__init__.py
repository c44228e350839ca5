"""Thin Hydra entrypoints. `conf_dir()` is where their YAML lives: the checkout's `conf/`
(source tree, editable install) or the copy a wheel installs as `decentrain/conf` (setup.py)."""

from pathlib import Path


def conf_dir() -> Path:
    source = Path(__file__).resolve().parents[1] / "conf"
    if (source / "config.yaml").is_file():
        return source
    import decentrain

    return Path(decentrain.__file__).resolve().parent / "conf"
