"""Evaluate a trained HDEE ensemble on any domain's split with every chosen weighting.

    python -m recipes.ensemble_eval hdee_plan=het_sizes eval.split=test
    python -m recipes.ensemble_eval hdee_plan=het_sizes eval.domains=[arithmetic] eval.weightings=[cached]
    torchrun --nproc-per-node 3 -m recipes.ensemble_eval ...   # experts spread over 3 ranks

Use the same hdee_plan (and ensemble_dir) as for training; a different plan is refused.
Results go to <ensemble_dir>/eval_<split>.json (or eval.out) and a table is printed.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.hdee.config import hdee_config_from_dict, load_saved_config
from decentrain.algorithms.hdee.evaluate import EnsembleScorer, check_saved_plan, expert_refs, format_table
from decentrain.core.world import init_world
from recipes import config_errors, recipe, run


@recipe("hdee", "hdee")
def main(dcfg: DictConfig) -> None:
    raw = OmegaConf.to_container(dcfg, resolve=True)
    with config_errors():
        cfg = hdee_config_from_dict(raw)  # the one conversion: library code sees dataclasses only
    check_saved_plan(cfg, load_saved_config(cfg.ensemble_dir))
    expert_refs(cfg)  # a missing expert fails here, before any process group or data
    world = init_world(threads=cfg.train.threads, device=cfg.train.device)
    try:
        scorer = EnsembleScorer(cfg, world)
        results = scorer.evaluate()
    finally:
        world.shutdown()
    if world.is_main:
        out = Path(cfg.eval.out or Path(cfg.ensemble_dir) / f"eval_{cfg.eval.split}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"config": raw, "world_size": world.world_size, "results": results}, indent=2))
        print(f"perplexity on the {cfg.eval.split} split ({cfg.ensemble_dir}):")
        print(format_table(results, cfg.eval.weightings))
        print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
