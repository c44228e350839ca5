from decentrain.data import pinned_source  # noqa: F401  (registers data.source=pinned beside offline and hf)
from decentrain.data.blocks import Corpus, DataConfig, ShardedSampler, build_corpus, encode, pack

__all__ = ["Corpus", "DataConfig", "ShardedSampler", "build_corpus", "encode", "pack"]
