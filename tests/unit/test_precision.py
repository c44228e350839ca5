"""Precision, compile, fused AdamW, host syncs, throughput metrics."""

from __future__ import annotations

import pytest
import torch

from decentrain.algorithms.pretraining.precision import (
    apply_compile,
    autocast,
    resolve_precision,
    transformer_blocks,
    weight_dtype,
)
from decentrain.core.metrics import LoggerConfig, Throughput, flops_per_token, mfu, peak_flops
from decentrain.models.factory import ModelConfig, build_model

TINY = ModelConfig(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_seq_len=32)


def test_precision_auto_is_bf16_autocast_on_cuda_and_fp32_on_cpu():
    assert resolve_precision("auto", torch.device("cuda", 0)) == "bf16_autocast"
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert weight_dtype("bf16_autocast") == torch.float32 and weight_dtype("bf16") == torch.bfloat16
    with autocast("bf16_autocast", torch.device("cpu")):
        assert torch.nn.Linear(4, 4)(torch.ones(1, 4)).dtype == torch.bfloat16
    with autocast("fp32", torch.device("cpu")):
        assert torch.nn.Linear(4, 4)(torch.ones(1, 4)).dtype == torch.float32


def test_outer_optimizers_keep_fp32_state_for_bf16_weights():
    from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
    from decentrain.algorithms.outer.updates import OuterOptimizer

    params = [torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))]
    outer = OuterOptimizer(params, OuterOptimizerConfig(lr=0.7, momentum=0.9))
    outer.step([torch.full((3,), 1e-3)])
    assert outer.slow[0].dtype == torch.float32
    assert outer.opt.state[outer.slow[0]]["momentum_buffer"].dtype == torch.float32
    assert outer.slow[0][0].item() != 1.0  # the update survives in fp32 (bf16 would round 1 - 7e-4 to 1)


def test_compile_blocks_in_place_keeps_state_dict_keys():
    model = build_model(TINY)
    keys = list(model.state_dict())
    apply_compile(model, "blocks")
    assert all(b._compiled_call_impl is not None for b in transformer_blocks(model))
    assert list(model.state_dict()) == keys
    whole = apply_compile(build_model(TINY), "model")
    assert whole._compiled_call_impl is not None and list(whole.state_dict()) == keys


def test_flops_formula_and_mfu_by_hand():
    # the 125M Llama: N non-embedding params, L=12, H=768, T=1024
    assert flops_per_token(100, 12, 768, 1024) == 6 * 100 + 12 * 12 * 768 * 1024
    assert mfu(tokens_per_s=1000.0, flops_per_tok=1e9, peak=1e13) == pytest.approx(0.1)
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("NVIDIA H100 80GB HBM3", override=5e14) == 5e14
    assert peak_flops("Some Unknown GPU") is None
    with pytest.raises(ValueError, match="logger.peak_flops"):
        LoggerConfig(peak_flops=float("nan"))


def test_throughput_reads_tokens_per_second_and_mfu():
    t = Throughput(
        tokens_per_rank_step=1000, tokens_global_step=4000, flops_per_tok=1e6, peak=1e10, device=torch.device("cpu")
    )
    assert t.read() == {}
    for _ in range(2):
        with t.measure():
            pass
    t.seconds = 0.5  # two steps in half a second
    out = t.read()
    assert out["perf/step_ms"] == pytest.approx(250.0)
    assert out["perf/tokens_per_s"] == pytest.approx(4000.0)
    assert out["perf/tokens_per_s_global"] == pytest.approx(16000.0)
    assert out["perf/mfu"] == pytest.approx(4000.0 * 1e6 / 1e10)
    assert t.steps == 0 and t.read() == {}


def test_model_flops_per_token_excludes_the_embedding_table():
    from decentrain.algorithms.pretraining.trainer import model_flops_per_token

    model = build_model(TINY)
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    assert model_flops_per_token(model, 32) == 6 * n + 12 * 2 * 16 * 32


def _trainer(tmp_path, **train):
    from decentrain.algorithms.ddp.ddp import DDP
    from decentrain.algorithms.pretraining.trainer import Trainer
    from decentrain.config import LoopConfig, TrainConfig
    from decentrain.core.world import World
    from decentrain.data.blocks import DataConfig, build_corpus
    from decentrain.models.factory import build_tokenizer

    cfg = TrainConfig(
        model=TINY,
        data=DataConfig(domains=["licenses"], seq_len=32, max_bytes_per_domain=20_000),
        train=LoopConfig(steps=2, global_batch_size=4, micro_batch_size=2, eval_batches=2, **train),
    )
    tok = build_tokenizer(cfg.model)
    world = World()
    return Trainer(
        cfg.train,
        world,
        DDP(cfg.algorithm, world),
        build_model(cfg.model, tok),
        build_corpus(cfg.data, tok),
        tmp_path,
        engine=cfg.engine,
        optim=cfg.optim,
        logger=cfg.logger,
    )


def test_train_step_and_eval_never_sync_the_host_per_micro_batch(tmp_path, monkeypatch):
    from decentrain.algorithms.pretraining.trainer import evaluate

    trainer = _trainer(tmp_path)

    def no_sync(*a, **k):
        raise AssertionError("host sync inside the step")

    steps = []
    # torch's CPU AdamW reads its step counter on the host (CUDA's fused one does not): leave it out
    monkeypatch.setattr(trainer.engine, "step", lambda: steps.append(1))
    monkeypatch.setattr(torch.Tensor, "item", no_sync)
    loss = trainer.train_step(trainer.model)  # 2 micro-batches
    assert steps == [1]
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0
    out = evaluate(trainer.model, trainer.val_blocks, 1, torch.device("cpu"))  # 2 batches; one .tolist()
    monkeypatch.undo()
    assert set(out) == {"licenses"} and out["licenses"] > 0


@pytest.mark.parametrize(
    "precision,dtype", [("bf16_autocast", torch.float32), ("bf16", torch.bfloat16), ("auto", torch.float32)]
)
def test_precision_sets_master_weights_and_adamw_state(tmp_path, precision, dtype):
    trainer = _trainer(tmp_path, precision=precision)
    trainer.train_step(trainer.model)
    p = next(trainer.model.parameters())
    assert p.dtype == dtype and trainer.engine.optimizer.state[p]["exp_avg"].dtype == dtype
    assert not trainer.engine.optimizer.defaults["fused"]  # fused AdamW only for CUDA parameters
