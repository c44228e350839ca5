"""Inner engines: one replica's backward and optimizer step, picked by `engine.name`.

base.py holds the interface, the registry and the configs; each engine is one module that
registers itself. Adding an engine: a module here, its import below, a conf/engine/ YAML.
"""

from decentrain.algorithms.common.engines import deepspeed, fsdp2, torch  # noqa: F401  (register the engines)
from decentrain.algorithms.common.engines.base import (  # noqa: F401  (the package's public names)
    ENGINES,
    SCHEDULES,
    Engine,
    EngineConfig,
    OptimConfig,
    build_optimizer,
    lr_factor,
)
