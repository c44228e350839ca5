"""`decentrain experiment=sparseloco_cpu` end to end on 2 local gloo ranks, and its exact resume."""

from pathlib import Path

import pytest
import torch

from decentrain.testing import metrics, run_ranks, run_train

pytestmark = pytest.mark.integration


def test_sparseloco_experiment_sends_compressed_payloads_every_h(tmp_path):
    run_train(
        tmp_path,
        "experiment=sparseloco_cpu",
        "launcher.nproc_per_node=2",
        "algorithm.inner_steps=3",
        "train.steps=6",
        "train.eval_every=6",
        "algorithm.tiling=flat",
        "algorithm.quantizer=maxabs",
        "algorithm.chunk_size=512",
        "algorithm.topk=8",
    )
    rows = [r for r in metrics(tmp_path) if "outer/bytes_sent" in r]
    assert [r["step"] for r in rows] == [3, 6]
    from decentrain.models.factory import ModelConfig, build_model, build_tokenizer

    mc = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    numel = sum(p.numel() for p in build_model(mc, build_tokenizer(mc)).parameters())
    chunks = -(-numel // 512)
    payload = 32 + chunks * (8 * 2 + 4) + -(-chunks * 8 * 2 // 8)  # header, uint16 indices, fp32 scales, 2-bit codes
    assert 4 * numel / payload > 80  # top-8 of 512 at 2 bits: ~0.34 bits per entry against 32
    for r in rows:
        assert r["outer/payload_bytes"] == payload
        assert r["outer/bytes_sent"] == payload + 8  # one peer: its block once, plus the size announcement
        assert r["outer/payload_dropped"] == 0 and r["outer/pseudo_grad_norm"] > 0


def _straight_and_preempted(world, root):
    from safetensors.torch import load_file

    from decentrain.algorithms.pretraining.run import run_pretraining
    from decentrain.config import config_from_dict
    from decentrain.core.metrics import read_jsonl

    def cfg(stop_at=None):
        return config_from_dict(
            {
                "algorithm": {"name": "sparseloco", "inner_steps": 2, "chunk_size": 256, "topk": 8, "bits": 2},
                "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
                "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
                "train": {
                    "steps": 8,
                    "global_batch_size": 4,
                    "micro_batch_size": 1,
                    "eval_every": 4,
                    "eval_batches": 1,
                    "checkpoint_every": 100,
                    "threads": 1,
                    "stop_at": stop_at,
                },
                "logger": {"progress": False, "log_every": 1},
                "launcher": {"name": "torchrun", "nproc_per_node": None},
            }
        )

    straight, preempted = Path(root) / "straight", Path(root) / "preempted"
    a = run_pretraining(cfg(), world, straight)
    run_pretraining(cfg(stop_at=5), world, preempted)  # after two syncs (non-zero EF buffer), mid-round
    b = run_pretraining(cfg(), world, preempted)
    if world.rank:
        return None
    losses = [
        {r["step"]: r["train/loss"] for r in read_jsonl(d / "metrics.jsonl") if "train/loss" in r}
        for d in (straight, preempted)
    ]
    weights = [load_file(d / "model" / "model.safetensors") for d in (straight, preempted)]
    same = all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    return losses, same, a.eval_loss == b.eval_loss


@pytest.mark.slow
@pytest.mark.timeout(900)  # above run_ranks' 600 s
def test_preempted_sparseloco_resumes_bit_exactly(tmp_path):
    (straight, resumed), same_weights, same_eval = run_ranks(_straight_and_preempted, 2, str(tmp_path), timeout=600)[0]
    assert sorted(resumed) == list(range(1, 9))
    assert resumed == straight
    assert same_weights and same_eval
