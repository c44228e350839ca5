"""DEI recipe: `python -m recipes.dei [overrides]`: a distributed quality-diversity search in Core War.

Outside torchrun it starts `num_nodes` local nodes that survive each other's death (a dead node
costs its peers its elites, not the run); each node runs DRQ's rounds with its own language
model and shares its best elites through the job's store at each round's end. At the end this
process merges the nodes' final archives and writes `summary.json` (QD-score and coverage,
each node's figures, and every elite re-evaluated against the initial opponents).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.dei.config import DEIConfig
from decentrain.algorithms.dei.pmars import PMarsUnavailable
from decentrain.algorithms.dei.run import preflight, run_node, summarize
from decentrain.core.launch.launcher import launch_survivors
from decentrain.core.world import read_launch_env
from recipes import config_errors, recipe, run, typed_config

log = logging.getLogger(__name__)


def to_config(dcfg: DictConfig) -> DEIConfig:
    """The one conversion: Hydra's config to the typed dataclass (validation runs here, before start)."""
    return typed_config(dcfg, DEIConfig)


@recipe("dei", "dei")
def main(dcfg: DictConfig) -> None:
    # bad config, a missing simulator or limits no battle fits: one clear line, before any node starts
    with config_errors(PMarsUnavailable):
        cfg = to_config(dcfg)
        run_dir = Path(cfg.run_dir).resolve()
        preflight(cfg, run_dir)
    if read_launch_env().under_torchrun or cfg.num_nodes == 1:
        run_node(cfg, run_dir)
        if cfg.num_nodes > 1:
            return
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(dcfg, resolve=True))
        launch_survivors(
            [*HydraConfig.get().overrides.task, f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"],
            cfg.num_nodes,
            run_dir,
            module="recipes.dei",
        )
    summary = summarize(cfg, run_dir)
    print(
        f"DEI: {summary['nodes_finished']} node(s), merged archive QD-score {summary['merged']['qd_score']:.2f}, "
        f"coverage {summary['merged']['coverage']:.1%} ({summary['merged']['cells']} cells); "
        f"{run_dir / 'summary.json'}"
    )


if __name__ == "__main__":
    run(main)
