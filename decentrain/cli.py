"""The `decentrain` console script.

`decentrain [overrides]` runs the pre-training recipe (`recipes/train.py`);
`decentrain compare [overrides]` trains DDP, DiLoCo, NoLoCo and SparseLoCo at one layout and
plots them side by side (`recipes/compare.py`). Both are Hydra apps; `recipes` and the configs
ship in the wheel (setup.py), so this runs from any directory after `pip install`.
"""

import sys
from typing import Callable


def _train() -> Callable[[], None]:
    from recipes.train import main

    return main


def _compare() -> Callable[[], None]:
    from recipes.compare import main

    return main


# first argument -> (its recipe's main, imported on use; its Hydra config); anything else is an
# override of recipes.train. Static imports: no module name is ever built from text.
COMMANDS = {"compare": (_compare, "compare")}
DEFAULT = (_train, "config")


def main() -> None:
    recipe, config_name = DEFAULT
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        recipe, config_name = COMMANDS[sys.argv.pop(1)]
    from recipes import run

    run(recipe(), config_name)
