"""Algorithm families, on the shared `base` (hooks + registry), `pretraining` (the loop, its engines and
transports) and `outer` (the outer updates: outer optimizers, overlap, compression).

Importing this package imports no family, so no family pulls in another through it.
A loop algorithm registers itself when its package is imported; decentrain/config.py
(the composition root) imports them all.
"""

from decentrain.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig"]
