"""N replicas of one pre-training job as threads of this process, over `core/comm/inprocess_transport.py`.

The same `Trainer` and algorithm hooks as a multi-process run, so tests and benchmarks
exercise the library's own loop without starting processes or process groups. Each replica
builds its model after the same seed (so they start identical, which is what the start-up
broadcast ensures across processes) and gets a non-distributed `World` of its rank: no
process group is ever created, every message goes through the algorithm's `transport`.

A `run_dir` holding checkpoints (with `resume`, the default) is resumed from its newest step, as
`run_pretraining` does. Limits: the replicas share one torch RNG (the tiny models here have no dropout) and one
intra-op thread pool; the caller sets `torch.set_num_threads`. Algorithms without a
`transport` attribute (DDP) cannot run here.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.pretraining.config import TrainConfig
from decentrain.algorithms.pretraining.trainer import Trainer, TrainResult, seed_everything
from decentrain.core.comm.inprocess_transport import InProcessHub
from decentrain.core.comm.transport import Transport
from decentrain.core.metrics import MetricsLogger, drop_rows_after, metrics_file
from decentrain.core.world import World, plan_placement, visible_gpus
from decentrain.data.blocks import build_corpus
from decentrain.models.factory import build_model, build_tokenizer

log = logging.getLogger(__name__)


def _stats(algorithm) -> dict[str, float]:
    if not hasattr(type(algorithm), "transport"):
        return {}
    # deadline_s: None without one
    return {k: float(v) for k, v in vars(algorithm.transport.stats).items() if v is not None}


@dataclass
class ReplicaRun:
    result: TrainResult
    weights: dict[str, torch.Tensor]  # the replica's final model state
    exchange_stats: dict[str, float]  # the transport's ExchangeStats at the end
    step_times: list[float]  # seconds of each step this run took, outer step included (Trainer.step_times)


def run_replicas_in_process(
    cfg: TrainConfig,
    world_size: int,
    run_dir: Path,
    deadline_s: float | None = None,
    wrap_transport: Callable[[Transport], Transport] | None = None,
) -> list[ReplicaRun]:
    """Train `world_size` replicas of `cfg` as threads; each replica's result, in rank order.
    `wrap_transport` wraps each replica's transport (benchmarks: an emulated slow link)."""
    algo_cls = ALGORITHMS.get(cfg.algorithm.name)
    algo_cls.check_world(cfg.algorithm, world_size)
    hub = InProcessHub(world_size, deadline_s)  # what transport=inprocess (pretraining/transports/inprocess.py) runs on
    placement = plan_placement(cfg.train.device, world_size, visible_gpus())
    seed_everything(cfg.train.seed)
    tokenizer = build_tokenizer(cfg.model)
    corpus = build_corpus(cfg.data, tokenizer)  # read-only: shared by the replicas
    trainers, loggers = [], []
    for rank in range(world_size):
        seed_everything(cfg.train.seed)  # same seed on every replica: they start identical
        world = World(rank=rank, world_size=world_size, device=placement.device(rank))
        algorithm = algo_cls(cfg.algorithm, world)
        if hasattr(type(algorithm), "transport"):
            transport = hub.transport(rank)
            algorithm.transport = transport if wrap_transport is None else wrap_transport(transport)
        elif world_size > 1:
            raise ValueError(f"algorithm.name={cfg.algorithm.name} has no transport; in-process replicas need one")
        trainer = Trainer(
            cfg.train,
            world,
            algorithm,
            build_model(cfg.model, tokenizer),
            corpus,
            run_dir,
            engine=cfg.engine,
            optim=cfg.optim,
            logger=cfg.logger,
            resume=cfg.resume,
        )
        resumed = trainer.maybe_resume()  # the replicas share run_dir: they find the same newest step
        if resumed is not None:  # as run_pretraining: the steps after the checkpoint are logged again
            drop_rows_after(run_dir / metrics_file(rank), resumed)
        trainers.append(trainer)
        loggers.append(MetricsLogger(cfg.logger, run_dir, rank, None, total_steps=cfg.train.steps))
    results: dict[int, TrainResult] = {}
    errors: dict[int, BaseException] = {}

    def replica(rank: int) -> None:
        try:
            results[rank] = trainers[rank].fit(loggers[rank])
        except BaseException as e:  # noqa: BLE001 -- re-raised below, after the others were woken
            errors[rank] = e
            hub.abort(e)
        finally:
            loggers[rank].close()

    threads = [threading.Thread(target=replica, args=(r,), name=f"replica-{r}") for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        rank, error = min(errors.items())
        raise RuntimeError(f"in-process replica {rank} failed: {error!r}") from error
    return [
        ReplicaRun(
            results[r],
            {k: v.detach().clone() for k, v in trainers[r].model.state_dict().items()},
            _stats(trainers[r].algorithm),
            list(trainers[r].step_times),
        )
        for r in range(world_size)
    ]
