"""The `decentrain` console script.

`decentrain [overrides]` runs the pre-training recipe (`recipes/train.py`);
`decentrain compare [overrides]` trains DDP, DiLoCo, NoLoCo and SparseLoCo at one layout and
plots them side by side (`recipes/compare.py`). Both are Hydra apps; `recipes` and the configs
ship in the wheel (setup.py), so this runs from any directory after `pip install`.
`decentrain data prepare|verify|pack` builds and checks the pinned corpus (decentrain/data/prepare.py).
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


def _data(argv: list[str]) -> int:
    from decentrain.data.prepare import main as data_main

    return data_main(argv)


TOOLS = {"data": _data}  # plain command lines, not Hydra apps


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in TOOLS:
        sys.exit(TOOLS[sys.argv[1]](sys.argv[2:]))
    recipe, config_name = DEFAULT
    if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
        recipe, config_name = COMMANDS[sys.argv.pop(1)]
    from recipes import run

    run(recipe(), config_name)
