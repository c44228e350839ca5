"""How replicas reach each other, chosen by config: `transport.name` picks a registry entry.

One word for the idea, transport: an entry (a `TransportSpec`) owns its config class, its checks, how
the run's processes are started, the sampler it hands the trainer, and `connect`, which makes one
replica's `Transport` (core/comm/transport.py: pair exchange, collective mean, all-gather of bytes;
an algorithm reads it as `algorithm.transport`). The pre-training job path (`run.py`), the in-process
replicas and the recipe ask the entry and never test which one it is. Entries: `torch`
(torch.distributed, core/comm/dist_transport.py), `inprocess` (replicas as threads of one process,
core/comm/inprocess_transport.py), `torchft` (replica groups joined by torchft's Manager, every torchft
setting in its config; see torchft_groups.py for how far it shares the protocol).

Adding one: a module in this package that registers a `TransportSpec` subclass (found by the
package's own module list, no import list to edit), plus conf/transport/<name>.yaml.
"""

from decentrain.algorithms.pretraining.transports.base import (  # noqa: F401  (the package's public names)
    DEFAULT_TRANSPORT,
    FIELD,
    TRANSPORTS,
    TransportConfig,
    TransportSpec,
    transport_spec,
)
from decentrain.core.registry import discover

discover(__name__, __path__)  # every entry module of this package registers itself
