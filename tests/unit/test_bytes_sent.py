"""Every pre-training run logs what each worker sent (`comm/bytes_sent` per log line and
`comm/bytes_sent_total`), from one place: the transport counts every operation, DDP its per-step
ring share, and a sync that reports `outer/bytes_sent` itself is counted from that, never twice.
On the old code NoLoCo and DDP logged no bytes and no run printed a total."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decentrain.config import config_from_dict
from decentrain.core.comm.inprocess_transport import InProcessTransport
from decentrain.core.comm.transport import all_gather_bytes_sent, ring_all_reduce_bytes
from decentrain.core.metrics import CommMeter, format_bytes

ROOT = Path(__file__).resolve().parents[2]
STEPS, H = 6, 2


def _cfg(algo: dict):
    return config_from_dict(
        {
            "algorithm": algo,
            "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
            "train": {
                "steps": STEPS,
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "eval_every": 100,
                "eval_batches": 1,
                "checkpoint_every": 100,
                "threads": 1,
            },
            "logger": {"progress": False, "log_every": 1, "console": False},
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )


def test_wire_formulas():
    assert (
        ring_all_reduce_bytes(1000, 1) == 0
        and ring_all_reduce_bytes(1000, 2) == 1000
        and ring_all_reduce_bytes(1000, 4) == 1500
    )
    assert all_gather_bytes_sent(10, 1) == 0 and all_gather_bytes_sent(10, 4) == 30
    assert format_bytes(999) == "999 B" and format_bytes(1_234_567) == "1.2 MB" and format_bytes(2.5e9) == "2.50 GB"


def test_meter_prefers_a_reported_count_and_never_double_counts():
    m = CommMeter()
    m.start(0)
    assert m.step(None, 100) == 100.0  # the transport's counter moved by 100
    assert m.step(None, 100) == 0.0  # no sync this step
    assert m.step(40.0, 400) == 40.0  # the sync said what it sent: the counter's jump is not added too
    assert m.step(None, 450) == 50.0
    assert m.total == 190 and m.active
    silent = CommMeter()
    silent.start(None)
    assert silent.step(None, None) is None and not silent.active


@pytest.mark.parametrize(
    "algo, world, per_sync",
    [
        ({"name": "diloco", "inner_steps": H}, 2, lambda numel, n: ring_all_reduce_bytes(4 * numel, n)),
        ({"name": "noloco", "inner_steps": H, "pairing_seed": None, "stall_s": None}, 4, lambda numel, n: 4 * numel),
    ],
)
def test_in_process_runs_log_bytes_per_sync_and_in_total(tmp_path, algo, world, per_sync):
    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process

    torch.set_num_threads(1)
    runs = run_replicas_in_process(_cfg(algo), world, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    numel = sum(w.numel() for k, w in runs[0].weights.items() if "rotary" not in k)
    syncs = STEPS // H
    assert runs[0].result.bytes_sent >= syncs * per_sync(numel, world)
    assert runs[0].result.bytes_sent < syncs * per_sync(numel, world) * 1.01  # small extras (NoLoCo's pace values) only
    assert train[-1]["comm/bytes_sent_total"] == runs[0].result.bytes_sent
    per_line = [r.get("comm/bytes_sent", 0.0) for r in train]
    assert sum(per_line) == runs[0].result.bytes_sent and sum(1 for b in per_line if b) == syncs


def test_saving_a_model_does_not_import_deepspeed(tmp_path):
    code = (
        "import sys\nfrom transformers import ByT5Tokenizer\n"
        "from decentrain.models.factory import ModelConfig, build_model, save_model\n"
        "cfg = ModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)\n"
        f"save_model(build_model(cfg, ByT5Tokenizer()), ByT5Tokenizer(), {str(tmp_path / 'm')!r})\n"
        "print('deepspeed' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert "Setting accelerator" not in out.stderr


class FramedTransport(InProcessTransport):
    """An in-process transport whose link adds 100 bytes of framing to every exchange and all-gather: bytes only
    the transport knows of, as a real link's headers and retransmissions are."""

    def exchange(self, tensors, group, round_idx):
        out = super().exchange(tensors, group, round_idx)
        self.stats.bytes_sent += 100
        return out

    def all_gather_bytes(self, data, max_bytes):
        out = super().all_gather_bytes(data, max_bytes)
        self.stats.bytes_sent += 100
        return out


def _sparseloco():
    from decentrain.algorithms.sparseloco import SparseLoCo, SparseLoCoConfig

    return SparseLoCo, SparseLoCoConfig(inner_steps=1, chunk_size=16, topk=4, bits=8)


def _compressed_noloco():
    from decentrain.algorithms.noloco import NoLoCo, NoLoCoConfig
    from decentrain.algorithms.noloco.compressed_gossip import NoLoCoCompressionConfig
    from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig

    compression = NoLoCoCompressionConfig(
        enabled=True, chunk_size=16, topk=4, bits=8, state_topk=4, state_bits=8, anchor_every=2
    )  # round 2 re-anchors: an all-gather beside the exchange
    return NoLoCo, NoLoCoConfig(
        inner_steps=1, outer_optimizer=OuterOptimizerConfig("noloco", lr=0.5, momentum=0.0), compression=compression
    )


@pytest.mark.parametrize("family", [_sparseloco, _compressed_noloco])
def test_a_compressed_sync_reports_what_its_transport_counted(family):
    """SparseLoCo and compressed NoLoCo log `outer/bytes_sent` from the transport's counter, the one count of
    bytes: the syncs' sum is the counter's total, framing included. Before, both counted their payloads by hand
    beside the transport and missed what only the transport knew (here 100 bytes per operation)."""
    from decentrain.core.comm.inprocess_transport import InProcessHub
    from decentrain.core.world import World
    from decentrain.testing import run_in_threads

    cls, cfg = family()
    hub = InProcessHub(2)

    def replica(rank):
        torch.manual_seed(rank)
        model = torch.nn.Linear(4, 4, bias=False)
        algo = cls(cfg, World(rank=rank, world_size=2))
        algo.transport = FramedTransport(hub, rank)
        algo.on_train_start(model, None)
        syncs = []
        for step in (1, 2):
            with torch.no_grad():
                model.weight.add_(0.1 * (rank + 1) * step)
            syncs.append(algo.after_optimizer_step(step, model, None)["outer/bytes_sent"])
        return syncs, algo.transport.stats.bytes_sent

    for syncs, counted in run_in_threads(replica, 2):
        assert all(s > 100 for s in syncs) and sum(syncs) == counted
