"""Every recipe runs a few steps on CUDA, including ranks sharing one GPU and NCCL with >= 2 GPUs.

Skipped without CUDA (tests/conftest.py skips the `gpu` marker); CI stays green.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from decentrain.testing import metrics, run_recipe, run_train

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count()
ALGOS = {
    "ddp": [],
    "diloco": ["algorithm.inner_steps=2"],
    "streaming_diloco": ["algorithm.inner_steps=2", "algorithm.num_fragments=2", "algorithm.overlap_steps=1"],
    "noloco": ["algorithm.inner_steps=2"],
}
SHORT = ["train.steps=4", "train.eval_every=4", "train.device=cuda"]


def _trained(run_dir: Path) -> list[dict]:
    rows = [r for r in metrics(run_dir) if "train/loss" in r]
    assert len(rows) == 4 and all(r["train/loss"] is not None for r in rows)
    assert rows[-1]["perf/tokens_per_s"] > 0 and rows[-1]["perf/mem_peak_gib"] > 0
    return rows


@pytest.mark.parametrize("algo", list(ALGOS))
def test_each_algorithm_trains_on_one_rank(tmp_path, algo):
    run_train(
        tmp_path, f"algorithm={algo}", *ALGOS[algo], *SHORT, "launcher.nproc_per_node=1", "train.global_batch_size=4"
    )
    _trained(tmp_path)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("algo", list(ALGOS))
def test_ranks_share_one_gpu_over_gloo(tmp_path, algo, ranks):
    """More local ranks than GPUs: round-robin on the GPUs, gloo between them (NCCL cannot share)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # one visible GPU, whatever the machine has
    try:
        run_train(
            tmp_path,
            f"algorithm={algo}",
            *ALGOS[algo],
            *SHORT,
            f"launcher.nproc_per_node={ranks}",
            f"train.global_batch_size={2 * ranks}",
            timeout=600,
        )
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    _trained(tmp_path)


def test_the_readme_command_runs_on_a_gpu_box(tmp_path):
    """`decentrain experiment=ddp_cpu` (2 ranks) failed on a 1-GPU H100: rank 1 got cuda:1."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    try:
        run_train(tmp_path, "experiment=ddp_cpu", "train.steps=4", "train.eval_every=4")
        run_train(tmp_path / "shared", "experiment=ddp_cpu", "train.steps=4", "train.eval_every=4", "train.device=auto")
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)


@pytest.mark.skipif(GPUS < 2, reason="NCCL between ranks needs 2 GPUs")
@pytest.mark.parametrize("algo", list(ALGOS))
def test_one_rank_per_gpu_runs_on_nccl(tmp_path, algo):
    run_train(
        tmp_path, f"algorithm={algo}", *ALGOS[algo], *SHORT, "launcher.nproc_per_node=2", "train.global_batch_size=4"
    )
    _trained(tmp_path)


@pytest.mark.parametrize("precision,compile_", [("bf16_autocast", "blocks"), ("bf16", "none"), ("fp32", "model")])
def test_precision_and_compile(tmp_path, precision, compile_):
    run_train(
        tmp_path,
        *SHORT,
        "launcher.nproc_per_node=1",
        "train.global_batch_size=4",
        f"train.precision={precision}",
        f"train.compile={compile_}",
        timeout=600,
    )
    _trained(tmp_path)


def test_fsdp2_replicas_on_cuda(tmp_path):
    ranks = 4
    proc = run_train(
        tmp_path,
        "algorithm=diloco",
        "algorithm.inner_steps=2",
        "engine=fsdp2",
        *SHORT,
        f"launcher.nproc_per_node={ranks}",
        "train.global_batch_size=8",
        timeout=600,
    )
    assert "2 replicas x 2 shards, fsdp2" in proc.stdout
    _trained(tmp_path)


SAPO_TINY = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.intermediate_size=64",
    "model.num_heads=4",
    "sampling.max_new_tokens=4",
    "task.size=100",
    "logger.progress=false",
]


def test_sft_and_rl_on_cuda(tmp_path):
    run_recipe(
        "recipes.sft",
        *SAPO_TINY,
        "sft.steps=3",
        "sft.batch_size=4",
        "sft.device=cuda",
        "eval.prompts_per_task=2",
        "eval.num_generations=2",
        f"run_dir={tmp_path / 'sft'}",
    )
    out = run_recipe(
        "recipes.rl",
        *SAPO_TINY,
        "loss.num_generations=4",
        "train.micro_batch_size=16",
        "sapo=silo",
        "train.rounds=2",
        "train.device=cuda",
        f"run_dir={tmp_path / 'rl'}",
    ).stdout
    assert "rounds 2" in out


def test_rl_collective_nodes_share_one_gpu(tmp_path):
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    try:
        run_recipe(
            "recipes.rl",
            *SAPO_TINY,
            "loss.num_generations=4",
            "train.micro_batch_size=16",
            "sapo=swarm_2_6",
            "num_nodes=2",
            "train.rounds=2",
            "batch.num_local=2",
            "batch.num_external=2",
            "train.device=cuda",
            f"run_dir={tmp_path}",
        )
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    for node in ("node0", "node1"):
        rows = [json.loads(x) for x in (tmp_path / node / "metrics.jsonl").read_text().splitlines()]
        assert [r["external_received"] for r in rows] == [2, 2]


def test_hdee_smoke_on_cuda(tmp_path):
    common = ["hdee_plan=smoke", f"ensemble_dir={tmp_path / 'ens'}", "train.device=cuda"]
    run_recipe("recipes.hdee_train", *common, timeout=600)
    run_recipe("recipes.ensemble_eval", *common, "eval.domains=[licenses]")
    assert (tmp_path / "ens" / "eval_test.json").exists()


def test_gpu_step_benchmark_smoke():
    from benchmarks.gpu_step import main

    assert main(["--smoke"]) == 0
