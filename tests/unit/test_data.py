import re

import torch
from transformers import ByT5Tokenizer

from decentrain.data.blocks import DataConfig, ShardedSampler, build_corpus, encode, pack, split_blocks, unique_shuffled


def test_fast_byte_encoding_matches_the_tokenizer():
    tok = ByT5Tokenizer()
    text = "def f(x):\n    return 'ünïcode' + x  # ✓"
    assert encode(tok, text).tolist() == tok(text, add_special_tokens=False)["input_ids"]


def test_pack_appends_eos_and_cuts_blocks():
    tok = ByT5Tokenizer()
    blocks = pack(["ab", "cde"], tok, seq_len=3)
    assert blocks.tolist() == [[100, 101, 1], [102, 103, 104]]


def test_splits_are_contiguous_and_disjoint():
    blocks = torch.arange(200).reshape(100, 2)
    a = split_blocks(blocks, 0.1, 0.1)
    rows = [tuple(r.tolist()) for s in a for r in a[s]]
    assert len(rows) == len(set(rows)) == 100
    assert len(a["val"]) == len(a["test"]) == 10
    assert a["train"][-1, 0] < a["val"][0, 0] < a["test"][0, 0]


def test_documents_do_not_leak_across_splits():
    # 200 distinct documents of 50 bytes: only the documents cut by a split boundary may be in two splits
    docs = [f"<doc{i:04d}>" + "x" * 41 for i in range(200)] * 2  # every document twice
    cfg = DataConfig(domains=["python_docs"], seq_len=16, val_fraction=0.1, test_fraction=0.1)
    tok = ByT5Tokenizer()
    splits = split_blocks(pack(unique_shuffled(docs, cfg.seed), tok, cfg.seq_len), 0.1, 0.1)

    def doc_ids(blocks):
        text = bytes((blocks.flatten().clamp(min=3) - 3).tolist()).decode(errors="replace")
        return set(re.findall(r"doc(\d{4})", text))

    train, val, test = (doc_ids(splits[s]) for s in ("train", "val", "test"))
    assert len(train & test) == 0 and len(train & val) <= 1 and len(val & test) <= 1
    assert len(train | val | test) >= 195  # duplicates dropped, nearly every document readable


def test_offline_corpus_builds_every_requested_domain():
    cfg = DataConfig(domains=["python_docs", "licenses"], seq_len=64, max_bytes_per_domain=20_000)
    corpus = build_corpus(cfg, ByT5Tokenizer())
    assert set(corpus.blocks) == {"python_docs", "licenses"}
    assert corpus.split("test", "licenses").shape[1] == 64


def test_sampler_shards_ranks_disjointly_and_resumes_exactly():
    samplers = [ShardedSampler(50, global_batch=8, rank=r, world_size=2, seed=1) for r in range(2)]
    first = [s.next_indices() for s in samplers]
    assert not set(first[0].tolist()) & set(first[1].tolist())
    s = samplers[0]
    for _ in range(9):  # crosses an epoch boundary
        s.next_indices()
    state = s.state_dict()
    expected = [s.next_indices() for _ in range(3)]
    fresh = ShardedSampler(50, global_batch=8, rank=0, world_size=2, seed=1)
    fresh.load_state_dict(state)
    assert all(torch.equal(a, fresh.next_indices()) for a in expected)
