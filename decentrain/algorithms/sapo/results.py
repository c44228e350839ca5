"""What a person reads of a SAPO run: one short line per round, and a summary plus `reward.png`
per node at the end (in `<run_dir>/<node>/`, beside its `metrics.jsonl`).

Three curves, as DESIGN asks: the node's own-rollout reward (`reward`: what learning moves), the
batch-mean reward (`batch_reward`: genrl's `train/rewards`, which rises by selection alone when
external groups are used) and held-out greedy accuracy (`heldout_greedy/*`, mean over tasks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from decentrain.core.metrics import plot_curves, read_jsonl
from decentrain.core.world import World

HELDOUT = "heldout_greedy/"


def swarm_mean(world: World, value: float) -> float:
    """The mean of `value` over the nodes of one collective job (every rank calls it each round);
    an independent node (hivemind, silo) knows only its own."""
    if not world.is_distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=world.device)
    dist.all_reduce(t, group=world.group)
    return float(t.item()) / world.world_size


def heldout_mean(metrics: dict[str, Any]) -> float | None:
    """The round's held-out greedy accuracy over tasks (`heldout_greedy/mean`), if it was evaluated."""
    if isinstance(metrics.get(HELDOUT + "mean"), (int, float)):
        return float(metrics[HELDOUT + "mean"])
    values = [v for k, v in metrics.items() if k.startswith(HELDOUT) and isinstance(v, (int, float))]
    return float(np.mean(values)) if values else None


def round_line(node_id: str, round_: int, metrics: dict[str, Any], swarm_reward: float | None) -> str:
    """One console line per round (the swarm's mean only in a collective job, held-out only in rounds that
    evaluated it), for example

        round 12 node0 | own reward 0.312 (swarm mean 0.280) | batch 0.500 | external groups 4 used of 6 received
        | held-out 0.250

    on one line."""
    parts = [
        f"round {round_} {node_id}",
        f"own reward {metrics.get('reward', float('nan')):.3f}"
        + (f" (swarm mean {swarm_reward:.3f})" if swarm_reward is not None else ""),
        f"batch {metrics.get('batch_reward', float('nan')):.3f}",
        f"external groups {int(metrics.get('external_groups', 0))} used of "
        f"{int(metrics.get('external_received', 0))} received",
    ]
    held = heldout_mean(metrics)
    if held is not None:
        parts.append(f"held-out {held:.3f}")
    return " | ".join(parts)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def summarize(node_dir: Path, node_id: str) -> dict[str, Any]:
    """summary.json and reward.png from the node's metrics.jsonl; returns the summary."""
    rows = read_jsonl(node_dir / "metrics.jsonl") if (node_dir / "metrics.jsonl").exists() else []
    held = [(r["step"], heldout_mean(r)) for r in rows if heldout_mean(r) is not None]
    own = _series(rows, "reward")[1]
    window = max(1, len(own) // 5)  # first and last fifth of the rounds: less noisy than one round
    summary = {
        "node": node_id,
        "rounds": len(own),
        "own_reward_first": float(np.mean(own[:window])) if own else None,
        "own_reward_last": float(np.mean(own[-window:])) if own else None,
        "batch_reward_mean": float(np.mean(_series(rows, "batch_reward")[1])) if own else None,
        "external_groups_used": int(sum(_series(rows, "external_groups")[1])),
        "heldout_first": held[0][1] if held else None,
        "heldout_last": held[-1][1] if held else None,
        "cumulative_reward": float(sum(_series(rows, "batch_reward")[1])),
        "window_rounds": window,
    }
    (node_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if rows:
        plot_rewards(rows, held, node_dir / "reward.png", node_id)
    return summary


def summary_line(s: dict[str, Any]) -> str:
    def f(v):
        return "-" if v is None else f"{v:.3f}"

    return (
        f"{s['node']}: {s['rounds']} rounds | own reward {f(s['own_reward_first'])} -> {f(s['own_reward_last'])} "
        f"(mean of first/last {s['window_rounds']}) | batch reward mean {f(s['batch_reward_mean'])} | "
        f"held-out {f(s['heldout_first'])} -> {f(s['heldout_last'])} | "
        f"external groups used {s['external_groups_used']}"
    )


def plot_rewards(rows: list[dict], held: list[tuple[int, float]], out_png: Path, title: str) -> Path:
    heldout = dict(held)
    records = [{**r, HELDOUT + "mean": heldout.get(r["step"])} for r in rows]
    return plot_curves(
        records,
        ["reward", "batch_reward", HELDOUT + "mean"],
        out_png,
        title,
        xlabel="round",
        ylabel="reward / accuracy",
        labels={
            "reward": "own-rollout reward",
            "batch_reward": "batch reward (external included)",
            HELDOUT + "mean": "held-out greedy accuracy",
        },
    )
