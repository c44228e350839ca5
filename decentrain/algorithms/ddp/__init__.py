from decentrain.algorithms.ddp.ddp import DDP, DDPConfig

__all__ = ["DDP", "DDPConfig"]
from decentrain.algorithms.ddp import torchft_ddp  # noqa: F401,E402  (registers the torchft variant; torchft imported lazily)
