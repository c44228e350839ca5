"""Start local (or multi-node) workers with torch's own launcher API when not under torchrun."""

from __future__ import annotations

import sys
import uuid

from torch.distributed.launcher.api import LaunchConfig, elastic_launch


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
