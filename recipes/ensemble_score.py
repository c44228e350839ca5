"""Score your own text file with a saved HDEE ensemble.

    python -m recipes.ensemble_score notes.txt ensemble_dir=runs/hdee/het_sizes
    python -m recipes.ensemble_score notes.txt ensemble_dir=... eval.weightings=[uniform,average]

The ensemble's own config (<ensemble_dir>/hdee.yaml, written at training) says which
experts, tokenizer and block length to use; `key=value` arguments override it. The
cached prior is fit on the validation split of eval.domains (default: data.domains).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import decentrain.config  # noqa: F401  (the composition root registers the loop algorithms job.algorithm names)
from decentrain.algorithms.hdee.config import load_saved_config
from decentrain.algorithms.hdee.evaluate import EnsembleScorer, format_table
from decentrain.core.world import init_world

USAGE = "usage: python -m recipes.ensemble_score FILE ensemble_dir=DIR [key=value ...]"


def main(argv: list[str]) -> None:
    files = [a for a in argv if "=" not in a]
    overrides = [a for a in argv if "=" in a]
    dirs = [o.split("=", 1)[1] for o in overrides if o.startswith("ensemble_dir=")]
    if len(files) != 1 or len(dirs) != 1:
        raise SystemExit(USAGE)
    path = Path(files[0])
    if not path.is_file():
        raise SystemExit(f"no such file: {path}\n{USAGE}")
    cfg = load_saved_config(dirs[0], [o for o in overrides if not o.startswith("ensemble_dir=")])
    if cfg is None:
        raise SystemExit(f"{dirs[0]} holds no hdee.yaml; train it with recipes.hdee_train first\n{USAGE}")
    world = init_world(threads=cfg.train.threads, device=cfg.train.device)
    try:
        result = EnsembleScorer(cfg, world).score_text(path.read_text(encoding="utf-8", errors="replace"))
    finally:
        world.shutdown()
    if world.is_main:
        print(f"{path}: {result['tokens']} scored tokens")
        print(format_table({path.name[:16]: result}, cfg.eval.weightings))
        print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
