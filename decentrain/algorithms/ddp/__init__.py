from decentrain.algorithms.ddp.ddp import DDP, DDPConfig

__all__ = ["DDP", "DDPConfig"]
