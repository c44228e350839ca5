"""Algorithm families. Importing this package registers every training-loop algorithm."""

from decentrain.algorithms import ddp, diloco, noloco  # noqa: F401  (register "ddp", "diloco", "streaming_diloco", "noloco")
from decentrain.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig, register_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "register_algorithm"]
