from transformers import ByT5Tokenizer

from decentrain.data.blocks import DataConfig, build_corpus


def test_local_text_through_datasets(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text("\n".join(f"line {i}: the quick brown fox" for i in range(400)))
    cfg = DataConfig(source="hf", domains=["mine"], hf_path="text", hf_data_files=[str(f)], seq_len=32)
    corpus = build_corpus(cfg, ByT5Tokenizer())
    blocks = corpus.split("train", "mine")
    assert blocks.shape[1] == 32 and len(blocks) > 100
    assert bytes((blocks[0][:4] - 3).tolist()).decode().startswith("line")
