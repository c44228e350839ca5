"""Inner engines: one replica's backward and optimizer step, picked by `engine.name`.

base.py holds the interface, the registry and the common config; each engine is one module
that registers itself (with its own config class if it has fields of its own), found by the
package's module list. Adding an engine: a module here plus conf/engine/<name>.yaml
(`defaults: [<name>_schema]`).
"""

from decentrain.algorithms.pretraining.engines.base import (  # noqa: F401  (the package's public names)
    ENGINES,
    SCHEDULES,
    Engine,
    EngineConfig,
    OptimConfig,
    build_optimizer,
    lr_factor,
)
from decentrain.core.registry import discover

discover(__name__, __path__)  # every engine module registers itself
