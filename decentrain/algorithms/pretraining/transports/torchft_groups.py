"""`transport=torchft` (selected by `launcher.fault_tolerance=torchft`): replica groups joined by torchft.

The recipe starts `launcher.replicas` groups, each its own torchrun job, and a Lighthouse
(core/launch/ft_launch.py). torchft's Manager owns membership and the cross-group collectives:
each collective family registers its torchft variant in `FT_ALGORITHMS` (ddp/torchft_ddp.py,
diloco/torchft_diloco.py), built here with the group, and each group reads its own data
slice. Departure from the `Transport` protocol, named: those variants sync through the
Manager (torchft's DDP/DiLoCo wrappers, which heal and re-form quorums themselves), not
through `core/comm/transport.py`'s operations; what this door shares with the others is the
entry: config, checks, how processes start, the algorithm and the trainer change.
"""

from __future__ import annotations

from pathlib import Path

from decentrain.algorithms.base import Algorithm
from decentrain.algorithms.pretraining.torchft import FT_ALGORITHMS, ReplicaGroup, replica_sampler
from decentrain.algorithms.pretraining.torchft.preflight import check_fault_tolerant_run
from decentrain.algorithms.pretraining.transports.base import TRANSPORTS, Door
from decentrain.core.launch.ft_launch import launch_replica_groups
from decentrain.core.world import World


@TRANSPORTS.register("torchft")
class TorchFTDoor(Door):
    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        if cfg.launcher.fault_tolerance != "torchft":
            raise ValueError(f"transport.name=torchft needs launcher.fault_tolerance=torchft (it starts the lighthouse "
                             f"and the replica groups); got {cfg.launcher.fault_tolerance!r}")
        check_fault_tolerant_run(cfg, world_size)

    @classmethod
    def algorithm(cls, cfg, world: World) -> Algorithm:
        group = ReplicaGroup.from_config(cfg.launcher.replicas, cfg.launcher.torchft)
        return FT_ALGORITHMS.get(cfg.algorithm.name)(cfg.algorithm, world, group, cfg.train.steps)

    @classmethod
    def attach(cls, trainer, cfg, world: World) -> None:
        trainer.sampler = replica_sampler(len(trainer.train_blocks), cfg.train.global_batch_size, world, trainer.algorithm.group,
                                          cfg.train.seed)

    @classmethod
    def launch(cls, cfg, overrides: list[str], run_dir: Path, module: str) -> bool:
        launch_replica_groups(overrides, cfg.launcher.replicas, cfg.launcher.nproc_per_node or 1, str(run_dir),
                              cfg.launcher.torchft, cfg.launcher.max_restarts, module=module)
        return True
