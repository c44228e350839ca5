"""Streaming DiLoCo fragments: the real split by parameter count, and comm_sync's fragment rows in real bytes."""

import argparse

import pytest

from benchmarks.comm_sync import fragment_sizes, summarise, wire
from decentrain.algorithms.diloco.streaming import StreamingDiLoCo, StreamingDiLoCoConfig
from decentrain.core.world import World

# llama_tiny: hidden 128, MLP 352, 4 layers, byte vocab 384, untied head
LAYER = 4 * 128 * 128 + 3 * 128 * 352 + 2 * 128  # q k v o, gate up down, two norms = 200,960
VOCAB = 384 * 128


def test_llama_tiny_fragments_are_unequal_as_documented():
    # P=3 strides layers {0,3} {1} {2}; layer 0 brings the embeddings, layer 3 the final norm and head
    assert fragment_sizes("llama_tiny", 3) == [2 * LAYER + 2 * VOCAB + 128, LAYER, LAYER]  # 500,352 / 200,960 / 200,960


def test_streaming_diloco_reports_its_real_fragment_sizes():
    from decentrain.models.factory import ModelConfig, build_model

    model = build_model(ModelConfig(hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64))
    algo = StreamingDiLoCo(StreamingDiLoCoConfig(inner_steps=3, num_fragments=3), World())
    algo.setup(model)
    numel = {n: p.numel() for n, p in model.named_parameters()}
    layer = sum(v for n, v in numel.items() if ".layers.0." in n)
    head = sum(v for n, v in numel.items() if "embed_tokens" in n or "lm_head" in n or n.endswith("model.norm.weight"))
    embed = numel["model.embed_tokens.weight"]
    assert algo.fragment_numels == [layer + embed, layer, layer + head - embed]
    assert sum(algo.fragment_numels) == sum(numel.values())


def test_fragment_rows_count_the_bytes_actually_reduced():
    assert wire("fragment", 4, 1000) == (6.0, 1500.0)  # ring over what was sent, not payload / P
    rows = [
        {"link": "loopback", "method": "fragment", "n": n, "numel": 1000, "bytes": 1200, "times": [0.1 * n]}
        for n in (2, 4)
    ]
    s = summarise(rows, argparse.Namespace(rate="100mbit", fragments=4))
    assert [r["upload_bytes"] for r in s["rows"]] == [1200.0, 1800.0]
    fit = s["fits"]["loopback/fragment"]
    m, b = wire("fragment", 100, 1200)
    assert s["extrapolated_s"]["loopback/fragment/N=100"] == pytest.approx(
        fit["alpha_s"] * m + b / fit["beta_bytes_per_s"]
    )
