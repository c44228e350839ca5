"""torchft integration for the collective families (`transport=torchft`, transports/torchft_groups.py).

`manager.build_manager` makes torchft's Manager for one rank of a replica group; the families
register their torchft variants in `FT_ALGORITHMS` (ddp/torchft_ddp.py, diloco/torchft_diloco.py),
each with its own `check_world`; `launch` starts the lighthouse and one torchrun job per group;
`heal_http.SafeHealHTTP` moves heal state pickle-free. Every setting is the `transport` section's.
"""

from decentrain.algorithms.pretraining.torchft.manager import (
    FT_ALGORITHMS,
    ReplicaGroup,
    build_manager,
    replica_sampler,
    torchft_available,
)

__all__ = ["FT_ALGORITHMS", "ReplicaGroup", "build_manager", "replica_sampler", "torchft_available"]
