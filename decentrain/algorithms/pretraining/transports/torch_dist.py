"""`transport=torch` (the default): torch.distributed over gloo or NCCL, one process per rank.

Outside torchrun the recipe starts `launcher.nproc_per_node` workers: torch elastic for
collective algorithms, the survivor launcher for gossip ones (a dead worker costs its
partners a round, not the job).
"""

from __future__ import annotations

from pathlib import Path

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.transports.base import TRANSPORTS, TransportConfig, TransportSpec
from decentrain.core.comm.dist_transport import TorchTransport
from decentrain.core.launch.config import LAUNCHERS
from decentrain.core.world import World


@TRANSPORTS.register("torch")
class TorchSpec(TransportSpec):
    @classmethod
    def connect(cls, world: World, cfg: TransportConfig) -> TorchTransport:
        return TorchTransport(world)

    @classmethod
    def launch(cls, cfg, overrides: list[str], run_dir: Path, module: str) -> bool:
        if (cfg.launcher.world_size or 1) <= 1:
            return False
        argv = [*overrides, f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"]
        LAUNCHERS.get(cfg.launcher.name).launch(
            argv,
            cfg.launcher,
            module=module,
            run_dir=str(run_dir),
            survivors=ALGORITHMS.get(cfg.algorithm.name).survives_peer_loss,
        )
        return True
