"""A DEI node's life in a job (world, key, operator, sharing, rounds) and the job's merged summary."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from decentrain.algorithms.dei.archive import Archive, merged_stats
from decentrain.algorithms.dei.config import DEIConfig
from decentrain.algorithms.dei.node import DEINode, load_warrior, loads_json, read_elites
from decentrain.algorithms.dei.operators import OperatorConfig, build_operator, check_operator
from decentrain.algorithms.dei.pmars import battle, probe
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
        log.info(
            "training this node's operator (%s, %d steps) on the shipped warriors", cfg.model.family, cfg.sft_steps
        )
        train_operator(OperatorSFTConfig(steps=cfg.sft_steps, seed=seed, model=cfg.model), out)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=str(out)))


def preflight(cfg: DEIConfig, run_dir: Path) -> None:
    """What a config cannot say about itself, checked once before any node starts (ValueError or
    PMarsUnavailable, in one line): the run dir can be made, the initial opponents load, each node's
    operator passes its own check, and pMARS runs one battle as large as the run's largest (the new
    warrior, the initial opponents, every champion) under the configured limits."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"run_dir={run_dir}: {e.strerror}") from None
    initial = [load_warrior(n, cfg) for n in cfg.search.initial_opponents]
    for i in range(cfg.num_nodes):
        check_operator(cfg.node_operator(i))
    size = cfg.search.battle_size
    probe([initial[i % len(initial)] for i in range(size)], cfg.pmars)


def run_node(cfg: DEIConfig, run_dir: Path) -> list[dict[str, Any]]:
    world = init_world(backend="gloo", device="cpu", threads=cfg.threads)
    try:
        node_dir = run_dir / f"node{world.rank}"
        node_dir.mkdir(parents=True, exist_ok=True)
        identity = NodeIdentity.load_or_create(node_dir / "node.key")
        op_cfg = prepare_operator(cfg.node_operator(world.rank), node_dir, cfg.seed * 1000 + world.rank)
        operator = build_operator(op_cfg, cfg.search.budget, world.device, cfg.seed * 1000 + world.rank)
        sharing = (
            StoreSharing(world.store, world.rank, world.world_size, identity, cfg.share)
            if world.store is not None and world.world_size > 1
            else None
        )
        return DEINode(cfg, world.rank, operator, sharing, run_dir).run()
    finally:
        world.shutdown()


MAX_METRICS_BYTES = 16 << 20  # a node's metrics.jsonl: one short row per round


def summarize(cfg: DEIConfig, run_dir: Path) -> dict[str, Any]:
    """Merge the nodes' final archives; QD-score and coverage on fitness re-measured against one
    common set of opponents (the initial ones), since each node's own fitness is against its own
    champions and so not comparable across nodes.

    What the nodes wrote is read as data: only node0..node{num_nodes-1}, sizes checked before
    reading, at most one elite per cell per node, and an entry or row that is malformed or holds a
    non-finite number is skipped and counted under `dropped`; `summary.json` holds finite numbers only.
    """
    drops: Counter[str] = Counter()
    opponents = [load_warrior(n, cfg) for n in cfg.search.initial_opponents]
    elites = read_elites(run_dir, drops=drops, num_nodes=cfg.num_nodes, max_chars=cfg.redcode.max_chars)
    axes = Archive(tuple(cfg.search.axes))
    common = []
    for i, e in enumerate(elites):
        w = parse(e.text, cfg.redcode).warrior
        result = battle([w, *opponents], cfg.pmars, seed=cfg.seed * 7919 + i) if w else None
        if result is not None:
            common.append(dataclasses.replace(e, fitness=result.share(0), cell=axes.cell(w)))
        else:
            drops["elite_not_evaluated"] += 1
    nodes = {}
    for i in range(cfg.num_nodes):
        path = run_dir / f"node{i}" / "metrics.jsonl"
        if path.exists():
            row = _last_row(path, drops)
            if row is not None:
                nodes[f"node{i}"] = row
    finished = sum(1 for row in nodes.values() if row["round"] == cfg.search.rounds - 1)
    summary = {
        "nodes_finished": finished,
        "nodes_reporting": len(nodes),
        "merged": merged_stats(common),
        "merged_own_fitness": merged_stats(elites),
        "dropped": dict(sorted(drops.items())),
        "nodes": nodes,
    }
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, allow_nan=False))
    tmp.replace(run_dir / "summary.json")
    return summary


def _last_row(path: Path, drops: Counter[str]) -> dict[str, Any] | None:
    """A node's last well-formed metrics row: an object of at most 256 numbers (or nulls) with an
    integer `round`; a malformed or oversized file or row is counted in `drops`."""
    try:
        if path.stat().st_size > MAX_METRICS_BYTES:
            drops["metrics_too_large"] += 1
            return None
        lines = path.read_bytes().splitlines()
    except OSError:
        drops["metrics_unreadable"] += 1
        return None
    for line in reversed([ln for ln in lines if ln.strip()]):
        row = loads_json(line, finite=True)
        if (
            isinstance(row, dict)
            and len(row) <= 256
            and type(row.get("round")) is int
            and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in row.values())
        ):
            return row
        drops["bad_metrics_row"] += 1
    return None
