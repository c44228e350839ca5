"""The `decentrain` console script: the pre-training recipe with Hydra overrides."""

import sys
from pathlib import Path


def main() -> None:
    # recipes/ and conf/ live at the repository root (editable install)
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from recipes.train import main as train_main

    train_main()
