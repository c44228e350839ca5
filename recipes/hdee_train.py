"""HDEE training recipe: seeds, then every expert lane as its own job.

    python -m recipes.hdee_train hdee_plan=het_sizes          # everything, lanes in parallel
    python -m recipes.hdee_train job.stage=seeds              # only the seeds
    python -m recipes.hdee_train -m job.stage=lane job.index=0,1,2   # one job per lane (Hydra multirun)

The plan (domains, fields, compute budget) is checked before anything trains. With
job.stage=all, outside torchrun, seeds and then lanes run as separate processes, at
most job.max_parallel at once; each job starts launcher.nproc_per_node data-parallel
replicas of `job.algorithm` if asked (a gossip algorithm such as NoLoCo under the survivor
launcher). Under torchrun every stage runs in this process group.

    python -m recipes.hdee_train job.stage=lane job.index=0 launcher.nproc_per_node=2 \
        algorithm@job.algorithm=noloco job.algorithm.inner_steps=10   # a lane trained by a NoLoCo pair
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.hdee.config import check_plan, hdee_config_from_dict, save_config
from decentrain.algorithms.hdee.jobs import child_jobs, run_jobs
from decentrain.algorithms.hdee.train import run_stage
from decentrain.core.launch.config import LAUNCHERS
from decentrain.core.launch.launcher import check_placement, exit_survivor
from decentrain.core.world import init_world, read_launch_env
from recipes import config_errors, recipe, run

MODULE = "recipes.hdee_train"


@recipe("hdee", "hdee")
def main(dcfg: DictConfig) -> None:
    raw = OmegaConf.to_container(dcfg, resolve=True)
    with config_errors():  # before any training: bad fields, unknown domains, empty steps, over budget
        cfg = hdee_config_from_dict(raw)  # the one conversion: library code sees dataclasses only
        rel = check_plan(cfg)
        check_placement(cfg.train.device, cfg.launcher.nproc_per_node)
    env = read_launch_env()
    algorithm = ALGORITHMS.get(cfg.job.algorithm.name)
    root = Path(cfg.ensemble_dir).resolve()
    overrides = list(HydraConfig.get().overrides.task)
    if not env.under_torchrun:
        root.mkdir(parents=True, exist_ok=True)
        save_config(root, {**raw, "ensemble_dir": str(root)})  # what ensemble_eval / ensemble_score read back
        print(
            f"[hdee] plan: {cfg.plan.num_experts} experts, compute {rel:+.2%} vs the homogeneous baseline; "
            f"ensemble dir {root}",
            flush=True,
        )
        if cfg.job.stage == "all":
            for stage in ("seed", "lane"):  # independent jobs; lanes wait for every seed
                run_jobs(child_jobs(cfg, stage, overrides, MODULE), cfg.job.max_parallel)
            same = " ".join(o for o in overrides if not o.startswith(("job.", "ensemble_dir=")))
            print(
                f"[hdee] all experts trained; evaluate with: python -m recipes.ensemble_eval {same} "
                f"ensemble_dir={root}",
                flush=True,
            )
            return
        if (cfg.launcher.world_size or 1) > 1:
            job = f"{cfg.job.stage}{'' if cfg.job.index is None else cfg.job.index}"
            try:  # a gossip job.algorithm gets the survivor launcher: a dead worker costs its partner a round
                LAUNCHERS.get(cfg.launcher.name).launch(
                    [*overrides, f"ensemble_dir={root}", f"hydra.run.dir={root}"],
                    cfg.launcher,
                    module=MODULE,
                    run_dir=root / "jobs" / job,
                    survivors=algorithm.survives_peer_loss,
                )
            except RuntimeError as e:
                sys.exit(f"[hdee] {e}")
            return
    world = init_world(threads=cfg.train.threads, device=cfg.train.device)
    try:
        run_stage(cfg, world)
    finally:
        world.shutdown()
    if algorithm.survives_peer_loss and world.store is not None:
        exit_survivor()  # done and saved; a helper thread may still be blocked on a dead partner


if __name__ == "__main__":
    run(main)
