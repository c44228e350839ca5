"""A DEI node's life in a job (world, key, operator, sharing, rounds) and the job's merged summary."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from decentrain.algorithms.dei.archive import Archive, merged_stats
from decentrain.algorithms.dei.config import DEIConfig
from decentrain.algorithms.dei.node import DEINode, load_warrior, read_elites
from decentrain.algorithms.dei.operators import OperatorConfig, build_operator
from decentrain.algorithms.dei.pmars import battle, find_pmars
from decentrain.algorithms.dei.redcode import parse
from decentrain.algorithms.dei.sft import OperatorSFTConfig, train_operator
from decentrain.algorithms.dei.sharing import StoreSharing
from decentrain.core.identity import NodeIdentity
from decentrain.core.world import init_world

log = logging.getLogger(__name__)


def prepare_operator(cfg: OperatorConfig, node_dir: Path, seed: int) -> OperatorConfig:
    """A `transformers` operator with no checkpoint is trained on the shipped warriors first (once)."""
    if cfg.name != "transformers" or cfg.model.pretrained or cfg.sft_steps == 0:
        return cfg
    out = node_dir / "operator"
    if not (out / "config.json").is_file():
        log.info("training this node's operator (%s, %d steps) on the shipped warriors", cfg.model.family,
                 cfg.sft_steps)
        train_operator(OperatorSFTConfig(steps=cfg.sft_steps, seed=seed, model=cfg.model), out)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=str(out)))


def run_node(cfg: DEIConfig, run_dir: Path) -> list[dict[str, Any]]:
    find_pmars(cfg.pmars)  # before any model is trained: a missing simulator is one line, now
    world = init_world(backend="gloo", device="cpu", threads=cfg.threads)
    try:
        node_dir = run_dir / f"node{world.rank}"
        node_dir.mkdir(parents=True, exist_ok=True)
        identity = NodeIdentity.load_or_create(node_dir / "node.key")
        op_cfg = prepare_operator(cfg.node_operator(world.rank), node_dir, cfg.seed * 1000 + world.rank)
        operator = build_operator(op_cfg, cfg.search.budget, world.device, cfg.seed * 1000 + world.rank)
        sharing = (StoreSharing(world.store, world.rank, world.world_size, identity, cfg.share)
                   if world.store is not None and world.world_size > 1 else None)
        return DEINode(cfg, world.rank, operator, sharing, run_dir).run()
    finally:
        world.shutdown()


def summarize(cfg: DEIConfig, run_dir: Path) -> dict[str, Any]:
    """Merge the nodes' final archives; QD-score and coverage on fitness re-measured against one
    common set of opponents (the initial ones), since each node's own fitness is against its own
    champions and so not comparable across nodes."""
    opponents = [load_warrior(n, cfg) for n in cfg.search.initial_opponents]
    elites = read_elites(run_dir)
    common = []
    for i, e in enumerate(elites):
        w = parse(e.text, cfg.redcode).warrior
        result = battle([w, *opponents], cfg.pmars, seed=cfg.seed * 7919 + i) if w else None
        if result is not None:
            common.append(dataclasses.replace(e, fitness=result.share(0), cell=Archive(tuple(cfg.search.axes)).cell(w)))
    nodes = {}
    for path in sorted(run_dir.glob("node*/metrics.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows:
            nodes[path.parent.name] = rows[-1]
    finished = sum(1 for row in nodes.values() if row["round"] == cfg.search.rounds - 1)
    summary = {"nodes_finished": finished, "nodes_reporting": len(nodes), "merged": merged_stats(common), "merged_own_fitness": merged_stats(elites),
               "nodes": nodes}
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(run_dir / "summary.json")
    return summary
