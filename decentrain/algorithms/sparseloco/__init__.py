from decentrain.algorithms.sparseloco.sparseloco import SparseLoCo, SparseLoCoConfig

__all__ = ["SparseLoCo", "SparseLoCoConfig"]
