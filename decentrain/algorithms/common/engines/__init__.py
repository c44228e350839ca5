"""Inner engines (one replica's backward and optimizer step), registered by `engine.name`."""

from decentrain.algorithms.common.engines import base, fsdp2  # noqa: F401  (registers torch, deepspeed, fsdp2)
from decentrain.algorithms.common.engines.base import (  # noqa: F401
    ENGINES, SCHEDULES, Engine, EngineConfig, OptimConfig, build_optimizer, lr_factor,
)
