from decentrain.algorithms.diloco.diloco import DiLoCo, DiLoCoConfig
from decentrain.algorithms.diloco.streaming import StreamingDiLoCo, StreamingDiLoCoConfig

__all__ = ["DiLoCo", "DiLoCoConfig", "StreamingDiLoCo", "StreamingDiLoCoConfig"]
