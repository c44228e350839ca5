from decentrain.algorithms.diloco.diloco import DiLoCo, DiLoCoConfig
from decentrain.algorithms.diloco.streaming import StreamingDiLoCo, StreamingDiLoCoConfig

__all__ = ["DiLoCo", "DiLoCoConfig", "StreamingDiLoCo", "StreamingDiLoCoConfig"]
from decentrain.algorithms.diloco import torchft_diloco  # noqa: F401,E402  (registers the torchft variants; torchft imported lazily)
