"""The door to the network, chosen by config: `transport.name` picks a registry entry.

An entry (a `Door`) owns its config class, its checks, the `Transport` it builds for one
replica (core/comm/transport.py: pair exchange, collective mean, all-gather of bytes), how the
run's processes are started, and what it changes in the trainer. The pre-training job
path (`run.py`), the in-process replicas and the recipe ask the entry and never test
which one it is. Entries: `torch` (torch.distributed, core/comm/dist_transport.py), `inprocess`
(replicas as threads of one process, core/comm/inprocess_transport.py), `torchft` (replica groups joined
by torchft's Manager, every torchft setting in its config; see torchft_groups.py for how far it shares the protocol).

Adding one: a module in this package that registers a `Door` subclass (found by the
package's own module list, no import list to edit), plus conf/transport/<name>.yaml.
"""

from decentrain.algorithms.pretraining.transports.base import (  # noqa: F401  (the package's public names)
    DEFAULT_DOOR,
    FIELD,
    TRANSPORTS,
    Door,
    TransportConfig,
    door,
)
from decentrain.core.registry import discover

discover(__name__, __path__)  # every entry module of this package registers itself
