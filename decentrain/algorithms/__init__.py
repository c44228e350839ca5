"""Algorithm families. Importing this package registers every training-loop algorithm."""

from decentrain.algorithms import ddp  # noqa: F401  (registers "ddp")
from decentrain.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig, register_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "register_algorithm"]
