from decentrain.data.blocks import Corpus, DataConfig, ShardedSampler, build_corpus, encode, pack

__all__ = ["Corpus", "DataConfig", "ShardedSampler", "build_corpus", "encode", "pack"]
