"""The `decentrain` console script.

`decentrain [overrides]` runs the pre-training recipe (`recipes/train.py`);
`decentrain compare [overrides]` trains DDP, DiLoCo, NoLoCo and SparseLoCo at one layout and
plots them side by side (`recipes/compare.py`). Both are Hydra apps; `recipes` and the configs
ship in the wheel (setup.py), so this runs from any directory after `pip install`.
"""

import importlib
import sys

# first argument -> (recipe module, its Hydra config); anything else is an override of recipes.train
COMMANDS = {"compare": ("recipes.compare", "compare")}
DEFAULT = ("recipes.train", "config")


def main() -> None:
    module, config_name = DEFAULT
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        module, config_name = COMMANDS[sys.argv.pop(1)]
    from recipes import run

    run(importlib.import_module(module).main, config_name)
