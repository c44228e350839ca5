"""`transport=inprocess`: `transport.replicas` replicas as threads of this process (core/comm/inprocess_transport.py).

No process group and no worker processes: the recipe runs the replicas here, through the same
`Trainer` and algorithm hooks (pretraining/inprocess_replicas.py), each replica's metrics in the run
dir as a multi-process run writes them. For tests, fast benchmarks and a laptop; gossip and
collectives give bit-identical results to torch.distributed (tests/integration/test_transports_agree.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.transports.base import TRANSPORTS, TransportConfig, TransportSpec
from decentrain.core.comm.inprocess_transport import InProcessTransport
from decentrain.core.config_checks import check_range
from decentrain.core.world import World

log = logging.getLogger(__name__)


@dataclass
class InProcessConfig(TransportConfig):
    name: str | None = "inprocess"
    replicas: int = 2
    deadline_s: float | None = None  # a gossip partner later than this costs the round; null: wait

    def __post_init__(self) -> None:
        check_range("transport.replicas", self.replicas, 1, 1024)
        check_range("transport.deadline_s", self.deadline_s, 0, 86400, low_open=True, none_ok=True)


@TRANSPORTS.register("inprocess", config=InProcessConfig)
class InProcessSpec(TransportSpec):
    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        if world_size != 1:
            raise ValueError(
                f"transport.name=inprocess runs its replicas in one process; got a world of {world_size} "
                "processes (use transport.replicas, not launcher.nproc_per_node)"
            )
        n = cfg.transport.replicas
        if not hasattr(ALGORITHMS.get(cfg.algorithm.name), "transport") and n > 1:
            raise ValueError(
                f"transport.name=inprocess with algorithm.name={cfg.algorithm.name}: it has no transport; "
                "allowed: an outer algorithm (diloco, noloco, ...)"
            )
        ALGORITHMS.get(cfg.algorithm.name).check_world(cfg.algorithm, n)
        if cfg.train.global_batch_size % (n * cfg.train.micro_batch_size):
            raise ValueError(
                f"train.global_batch_size={cfg.train.global_batch_size} does not divide into transport.replicas"
                f"={n} x train.micro_batch_size={cfg.train.micro_batch_size}"
            )

    @classmethod
    def connect(cls, world: World, cfg: TransportConfig) -> InProcessTransport:
        raise ValueError(
            "transport.name=inprocess: the replicas share one hub; pretraining/inprocess_replicas.py builds them"
        )

    @classmethod
    def launch(cls, cfg, overrides: list[str], run_dir: Path, module: str) -> bool:
        from decentrain.algorithms.pretraining.inprocess_replicas import (
            run_replicas_in_process,
        )  # it imports this package

        run_dir.mkdir(parents=True, exist_ok=True)
        runs = run_replicas_in_process(cfg, cfg.transport.replicas, run_dir, deadline_s=cfg.transport.deadline_s)
        log.info(
            "[decentrain] %s: %d in-process replicas done, train loss %s; metrics in %s",
            cfg.algorithm.name,
            len(runs),
            [round(r.result.train_loss, 4) for r in runs],
            run_dir,
        )
        return True
