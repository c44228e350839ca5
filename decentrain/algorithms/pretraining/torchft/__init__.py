"""torchft integration for the collective families (`launcher.fault_tolerance=torchft`).

`manager.build_manager` makes torchft's Manager for one rank of a replica group; the
families register their torchft variants in `FT_ALGORITHMS` (ddp/torchft_ddp.py,
diloco/torchft_diloco.py); `transport.SafeHTTPTransport` moves heal state pickle-free.
"""

from decentrain.algorithms.pretraining.torchft.manager import (FT_ALGORITHMS, ReplicaGroup, build_manager,
                                                               replica_sampler, torchft_available)

__all__ = ["FT_ALGORITHMS", "ReplicaGroup", "build_manager", "replica_sampler", "torchft_available"]
