"""The trainer logs the algorithm's metrics of every step, not only those of logged steps: a sync
that falls between two log lines still counts its bytes (they add up) and its readings (the newest)."""

from __future__ import annotations

from decentrain.core.metrics import read_jsonl


def test_byte_counts_add_up_and_readings_keep_the_newest():
    from decentrain.core.metrics import accumulate_metrics, is_summed_metric

    assert is_summed_metric("outer/bytes_sent") and is_summed_metric("outer/payload_bytes")
    assert not is_summed_metric("outer/round") and not is_summed_metric("outer/pseudo_grad_norm")
    pending = accumulate_metrics({}, {"outer/bytes_sent": 10.0, "outer/round": 1.0})
    pending = accumulate_metrics(pending, {})
    pending = accumulate_metrics(pending, {"outer/bytes_sent": 5.0, "outer/round": 2.0})
    assert pending == {"outer/bytes_sent": 15.0, "outer/round": 2.0}


def test_trainer_logs_the_bytes_of_syncs_between_log_lines(tmp_path):
    from decentrain.algorithms.ddp.ddp import DDP
    from decentrain.algorithms.pretraining.trainer import Trainer
    from decentrain.config import LoopConfig, TrainConfig
    from decentrain.core.metrics import LoggerConfig, MetricsLogger
    from decentrain.core.world import World
    from decentrain.data.blocks import DataConfig, build_corpus
    from decentrain.models.factory import ModelConfig, build_model, build_tokenizer

    class SyncEveryTwo(DDP):  # a stand-in for an outer algorithm: 100 bytes per sync, every 2 steps
        def after_optimizer_step(self, step, model, optimizer):
            return {"outer/bytes_sent": 100.0, "outer/round": float(step // 2)} if step % 2 == 0 else {}

    model = ModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_seq_len=16)
    cfg = TrainConfig(
        model=model,
        data=DataConfig(domains=["licenses"], seq_len=16, max_bytes_per_domain=8_000),
        train=LoopConfig(
            steps=6, global_batch_size=2, micro_batch_size=2, eval_every=100, eval_batches=1, checkpoint_every=100
        ),
        logger=LoggerConfig(progress=False, console=False, log_every=4),
    )
    tok = build_tokenizer(cfg.model)
    world = World()
    trainer = Trainer(
        cfg.train,
        world,
        SyncEveryTwo(cfg.algorithm, world),
        build_model(cfg.model, tok),
        build_corpus(cfg.data, tok),
        tmp_path,
        logger=cfg.logger,
    )
    logger = MetricsLogger(cfg.logger, tmp_path, 0)
    trainer.fit(logger)
    logger.close()
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in rows] == [4, 6]
    # steps 2 and 4 synced before the first line, step 6 before the last: 300 bytes in all
    assert [r["outer/bytes_sent"] for r in rows] == [200.0, 100.0]
    assert [r["outer/round"] for r in rows] == [2.0, 3.0]
