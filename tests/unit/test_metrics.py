import json

import pytest

from decentrain.core.metrics import LoggerConfig, MetricsLogger, plot_curves, read_jsonl


def test_jsonl_console_and_plot(tmp_path, capsys):
    log = MetricsLogger(LoggerConfig(progress=False), tmp_path, rank=0, total_steps=3)
    for step in (1, 2, 3):
        log.log(step, {"train/loss": 3.0 / step, "eval/loss": float("nan")})
    log.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["train/loss"] for r in records] == [3.0, 1.5, 1.0]
    assert records[0]["eval/loss"] is None  # NaN is not valid JSON
    assert "step      3 | train/loss 1" in capsys.readouterr().out
    assert plot_curves(records, ["train/loss"], tmp_path / "loss.png").stat().st_size > 1000


def test_only_rank_zero_writes_unless_all_ranks(tmp_path):
    MetricsLogger(LoggerConfig(progress=False), tmp_path, rank=1).log(1, {"x": 1.0})
    assert not list(tmp_path.glob("*.jsonl"))
    log = MetricsLogger(LoggerConfig(progress=False, all_ranks=True), tmp_path, rank=1)
    log.log(1, {"x": 1.0})
    log.close()
    assert json.loads((tmp_path / "metrics.rank1.jsonl").read_text())["x"] == 1.0


def test_wandb_offline_writes_a_local_run(tmp_path):
    pytest.importorskip("wandb")
    cfg = LoggerConfig(progress=False, console=False, wandb=True, wandb_mode="offline")
    log = MetricsLogger(cfg, tmp_path, rank=0, config={"lr": 1e-3})
    log.log(1, {"train/loss": 2.0})
    log.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))
