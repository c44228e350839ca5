"""Start local (or multi-node) workers with torch's own launcher API when not under torchrun."""

from __future__ import annotations

import sys
import uuid
from typing import Any, Callable

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from decentrain.core.world import Placement, plan_placement, read_launch_env, visible_gpus


def check_placement(device: str, nproc_per_node: int | None) -> Placement:
    """Refuse, before any worker starts, a device layout this node cannot serve (ValueError, one line).

    Under torchrun the node's local rank count comes from torchrun; otherwise from `nproc_per_node`.
    """
    env = read_launch_env()
    local_ranks = env.local_world_size if env.under_torchrun else (nproc_per_node or 1)
    return plan_placement(device, local_ranks, visible_gpus())


def launch_workers(argv: list[str], nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str = "localhost:0", max_restarts: int = 0, module: str = "recipes.train") -> None:
    """Run `python -m <module> <argv>` on `nproc_per_node` ranks here, as torchrun would.

    Raises torch's ChildFailedError (with each failed rank's exit code) if a worker fails.
    """
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint,
        max_restarts=max_restarts,
        monitor_interval=0.2,
    )
    elastic_launch(config, entrypoint=sys.executable)("-u", "-m", module, *argv)


def run_on_ranks(fn: Callable[..., Any], nproc: int, *args: Any) -> dict[int, Any]:
    """Call `fn(*args)` on `nproc` local ranks under torch's launcher; returns {rank: result}.

    For benchmarks and tools that run a Python function (not a module) on several ranks.
    """
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex[:12],
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2)
    return elastic_launch(config, fn)(*args)
