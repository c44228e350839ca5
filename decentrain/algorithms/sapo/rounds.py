"""The SAPO round loop around one `SAPONode`: exchange backend, metrics, checkpoint and resume.

Each node checkpoints into its own dir (`<run_dir>/checkpoints/<node_id>`) and never waits on
another to save. Resume goes through the same checked fallback as pre-training
(core/checkpoint.py): a round whose files fail their checksums is skipped with a one-line
warning. Under `collective`, ranks agree once at start on the newest round good on every
rank, so that their per-round all_gathers stay aligned; other exchanges resume each node
from its own newest good round.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from decentrain.algorithms.sapo.config import SAPOConfig
from decentrain.algorithms.sapo.evaluation import heldout_items
from decentrain.algorithms.sapo.exchange import EXCHANGES, build_exchange
from decentrain.algorithms.sapo.node import SAPONode
from decentrain.algorithms.sapo.results import round_line, summarize, summary_line, swarm_mean
from decentrain.core.checkpoint import Checkpointer
from decentrain.core.identity import NodeIdentity
from decentrain.core.metrics import MetricsLogger, drop_rows_after
from decentrain.core.world import World

logger = logging.getLogger(__name__)


def node_identity(cfg: SAPOConfig, world: World) -> tuple[int, str]:
    index = world.rank if cfg.node_index is None else cfg.node_index
    return index, cfg.node_id or f"node{index}"


def _resume_round(cfg: SAPOConfig, world: World, ckpt: Checkpointer) -> int | None:
    if not cfg.resume:
        return None
    if EXCHANGES.get(cfg.exchange.name).joins_process_group:  # one all-reduce at start-up (a no-op on one process)
        return ckpt.agree_resume_step(world)
    return ckpt.newest_good_step()  # swarm nodes are independent: no agreement, no wait


def run_sapo(cfg: SAPOConfig, world: World, run_dir: Path, on_round=None) -> dict[str, Any]:
    """Run `cfg.train.rounds` rounds (or up to `stop_at`) on this node; returns a summary.

    `on_round(node, metrics)`, if given, is called after each round (tests and benchmarks).
    """
    index, node_id = node_identity(cfg, world)
    cfg = cfg.for_node(index)
    run_dir = Path(run_dir)
    node_dir = run_dir / node_id
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "node_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1, default=str))
    key_file = cfg.key_file.replace("{node}", node_id) if cfg.key_file else node_dir / "node.key"
    identity = NodeIdentity.load_or_create(key_file)
    logger.info("%s signs as %s", node_id, identity.node_id)
    exchange = build_exchange(cfg.exchange, world, node_id)
    node = SAPONode(cfg, index, node_id, exchange, world.device, identity=identity)
    ckpt = Checkpointer(run_dir / "checkpoints" / node_id, rank=0, world_size=1, keep=cfg.train.keep_checkpoints)
    start = _resume_round(cfg, world, ckpt)
    if start is not None:
        node.load_state_dict(ckpt.load(start))
        drop_rows_after(node_dir / "metrics.jsonl", start)  # the rounds after it are logged again
        logger.info("%s resumed at round %d", node_id, start)
    # Every node writes its own metrics file: nodes differ (model, tasks, I/J).
    log = MetricsLogger(
        dataclasses.replace(cfg.logger, all_ranks=True, progress=False),
        node_dir,
        rank=0,
        config=dataclasses.asdict(cfg),
    )
    last = cfg.train.stop_at or cfg.train.rounds
    collective = world.is_distributed and EXCHANGES.get(cfg.exchange.name).joins_process_group
    metrics: dict[str, Any] = {}
    every = cfg.eval.every
    heldout = heldout_items(cfg.task, cfg.eval.prompts_per_task, cfg.eval.seed_offset) if every else {}

    def evaluate() -> dict[str, float]:
        return {f"heldout_greedy/{k}": v for k, v in node.heldout_accuracy(heldout).items()}

    try:
        if every and node.round == 0:
            log.log(0, evaluate(), console=index == 0)  # the starting policy: step 0
        while node.round < last:
            metrics = node.run_round()
            done = node.round  # rounds completed, this one included
            if every and (done % every == 0 or done == cfg.train.rounds):
                metrics.update(evaluate())
            # the collective job's ranks agree on the swarm's mean own reward; node 0 prints it
            swarm = swarm_mean(world, float(metrics.get("reward", 0.0))) if collective else None
            log.log(done, metrics, console=False)  # every field: metrics.jsonl; the console gets one short line
            if (index == 0 or not collective) and (done % cfg.logger.log_every == 0 or done == last):
                logger.info(round_line(node_id, done, metrics, swarm))
            if on_round is not None:
                on_round(node, metrics)
            if cfg.train.checkpoint_every and (done % cfg.train.checkpoint_every == 0 or done == last):
                ckpt.save(done, node.state_dict())
        if node.round >= cfg.train.rounds:
            node.save(node_dir / "final")
    finally:
        log.close()
        exchange.close()
        node.close()
    logger.info("%s (results: %s)", summary_line(summarize(node_dir, node_id)), node_dir)
    return {"node_id": node_id, "rounds": node.round, "cumulative_reward": node.cumulative_reward, **metrics}
