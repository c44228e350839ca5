"""SAPO recipe: `python -m recipes.rl [overrides]`, or under torchrun (one node per rank).

- `exchange=collective num_nodes=N`: outside torchrun this starts N local ranks through torch's
  launcher API; under torchrun (any number of machines) every rank is one node.
- `exchange=hivemind node_index=i`: one independent node per process (launch/sapo_swarm.sh).
- `exchange=silo`: one node alone (J=0).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.sapo.config import SAPOConfig, sapo_config_from_dict
from decentrain.algorithms.sapo.exchange import EXCHANGES
from decentrain.algorithms.sapo.rounds import run_sapo
from decentrain.core.comm.bytes_comm import agree_run_dir
from decentrain.core.launch.launcher import check_placement, launch_workers
from decentrain.core.world import init_world, local_world, read_launch_env
from decentrain.models.factory import check_model_paths
from recipes import config_errors, recipe, run


def to_config(dcfg: DictConfig) -> SAPOConfig:
    """The one conversion: Hydra's config to typed dataclasses (validation runs here, before start)."""
    return sapo_config_from_dict(OmegaConf.to_container(dcfg, resolve=True))


def config_or_exit(dcfg: DictConfig) -> SAPOConfig:
    """The typed config, or exit with one `config error: <field>...` line (before any process or DHT starts)."""
    with config_errors():
        cfg = to_config(dcfg)
        for i in range(max(1, len(cfg.nodes))):  # a mistyped checkpoint path fails here, not after hub retries
            check_model_paths(cfg.for_node(i).model, f"nodes[{i}].model" if cfg.nodes else "model")
    return cfg


@recipe("rl", "sapo")
def main(dcfg: DictConfig) -> None:
    cfg = config_or_exit(dcfg)
    # SIGTERM (launch/sapo_swarm.sh, Slurm) unwinds normally, so the hivemind DHT process is shut down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = read_launch_env()
    collective = EXCHANGES.get(cfg.exchange.name).joins_process_group
    if collective and not env.under_torchrun and cfg.num_nodes > 1:
        run_dir = str(Path(cfg.run_dir).resolve())
        launch_workers(
            [*HydraConfig.get().overrides.task, f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"],
            cfg.num_nodes,
            module="recipes.rl",
        )
        return
    # Only the collective exchange joins torch.distributed; hivemind/silo nodes stand alone.
    with config_errors():
        check_placement(cfg.train.device, cfg.num_nodes if collective else 1)
    world = (
        init_world(threads=cfg.train.threads, device=cfg.train.device)
        if collective
        else local_world(cfg.train.device, cfg.train.threads)
    )
    run_dir = agree_run_dir(world, cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if world.is_main and cfg.node_index in (None, 0):
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(dcfg, resolve=True))
    try:
        summary = run_sapo(cfg, world, run_dir)
        print(f"[{summary['node_id']}] rounds {summary['rounds']} cumulative_reward {summary['cumulative_reward']:.3f}")
    finally:
        world.shutdown()


if __name__ == "__main__":
    run(main)
