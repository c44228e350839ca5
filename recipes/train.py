"""Pre-training recipe: `decentrain [overrides]`, `python -m recipes.train`, or under torchrun.

Outside torchrun it validates the config, then starts `launcher.nproc_per_node` local
workers through torch's launcher API; each worker re-enters here under torchrun.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.run import run_pretraining
from decentrain.algorithms.pretraining.transports import transport_spec
from decentrain.config import config_from_dict, validate
from decentrain.core.comm.bytes_comm import agree_run_dir
from decentrain.core.launch.launcher import check_placement, exit_survivor
from decentrain.core.world import init_world, read_launch_env
from recipes import config_errors, recipe, run

MODULE = "recipes.train"


@recipe("config")
def main(dcfg: DictConfig) -> None:
    raw = OmegaConf.to_container(dcfg, resolve=True)
    env = read_launch_env()
    with config_errors():  # bad config: one clear line, before any process group or worker starts
        cfg = config_from_dict(raw)  # the one conversion: library code sees dataclasses only
        validate(cfg, env.world_size if env.under_torchrun else (cfg.launcher.world_size or 1))
        check_placement(cfg.train.device, cfg.launcher.nproc_per_node)
    if cfg.launcher.check_only:
        return
    if not env.under_torchrun:
        try:  # the transport starts the run's processes (torchrun workers, torchft groups) or runs it here (in-process)
            if transport_spec(cfg).launch(
                cfg, list(HydraConfig.get().overrides.task), Path(cfg.run_dir).resolve(), MODULE
            ):
                return
        except RuntimeError as e:
            sys.exit(f"[decentrain] {e}")
    world = init_world(threads=cfg.train.threads, device=cfg.train.device)
    # a replacement (incarnation > 0) joins no world collective: the launcher passed it the resolved run_dir
    run_dir = Path(cfg.run_dir) if world.incarnation else agree_run_dir(world, cfg.run_dir)
    if world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(raw))
    try:
        run_pretraining(cfg, world, run_dir, raw)
    finally:
        world.shutdown()
    if ALGORITHMS.get(cfg.algorithm.name).survives_peer_loss and world.store is not None and not env.slurm_task:
        # done and saved; a helper thread may still be blocked on a dead partner. (A submitit task
        # returns: submitit writes its result on the way out, and Slurm restarts no single rank.)
        exit_survivor()


if __name__ == "__main__":
    run(main)
