"""The `decentrain` console script.

`decentrain [overrides]` runs the pre-training recipe (`recipes/train.py`);
`decentrain compare [overrides]` trains DDP, DiLoCo, NoLoCo and SparseLoCo at one layout and
plots them side by side (`recipes/compare.py`). Both are Hydra apps; `recipes` and the configs
ship in the wheel (setup.py), so this runs from any directory after `pip install`.
"""

import importlib
import sys

# first argument -> the recipe module it runs; anything else is a Hydra override of recipes.train
COMMANDS = {"compare": "recipes.compare"}


def main() -> None:
    module = "recipes.train"
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        module = COMMANDS[sys.argv.pop(1)]
    importlib.import_module(module).main()
