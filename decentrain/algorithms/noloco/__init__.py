from decentrain.algorithms.noloco.noloco import NoLoCo, NoLoCoConfig

__all__ = ["NoLoCo", "NoLoCoConfig"]
