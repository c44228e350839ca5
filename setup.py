"""Ships the repository's top-level `conf/` inside the wheel, as `decentrain/conf`.

The top level (`recipes/`, `conf/` beside `decentrain/`) is fixed by the product card, and a
wheel installs only packages. pyproject.toml can map one source folder to a package but would
need every config group listed by hand; copying the whole tree at build time keeps a new group
(`conf/<group>/`) in the wheel with no packaging edit. `recipes.conf_dir()` finds either copy.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONF = Path(__file__).resolve().parent / "conf"


class BuildPyWithConf(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads conf/ in the checkout
            shutil.copytree(
                CONF,
                Path(self.build_lib) / "decentrain" / "conf",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )


setup(cmdclass={"build_py": BuildPyWithConf})
