"""A damaged newest checkpoint falls back to the newest good step with a one-line warning naming the file."""

import json
import logging

import pytest
import torch

from decentrain.core.checkpoint import Checkpointer, CheckpointError
from decentrain.core.metrics import drop_rows_after
from decentrain.core.world import World


def _truncate(p):
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _flip_last_byte(p):
    b = bytearray(p.read_bytes())
    b[-1] ^= 0x10  # a bit in the tensor data, past the header: parses fine, only the checksum sees it
    p.write_bytes(bytes(b))


DAMAGE = {
    "truncated safetensors": ("tensors.safetensors", _truncate),
    "empty safetensors": ("tensors.safetensors", lambda p: p.write_bytes(b"")),
    "garbage safetensors": ("tensors.safetensors", lambda p: p.write_bytes(b"\x07garbage" * 50)),
    "flipped bit in tensor data": ("tensors.safetensors", _flip_last_byte),
    "truncated json": ("state.json", _truncate),
    "garbage json": ("state.json", lambda p: p.write_text("{not json")),
    "empty json": ("state.json", lambda p: p.write_text("")),
    "json without state": ("state.json", lambda p: p.write_text("{}")),
    "deleted safetensors": ("tensors.safetensors", lambda p: p.unlink()),
    # Deleting the checksums used to turn verification off, so this bit flip loaded.
    "flipped bit, checksums deleted": (
        "checksums.json",
        lambda p: (_flip_last_byte(p.parent / "tensors.safetensors"), p.unlink()),
    ),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_newest_step_is_skipped_with_a_warning_naming_the_file(tmp_path, kind, caplog):
    ck = Checkpointer(tmp_path, rank=0, world_size=1, keep=3)
    for step in (1, 2):
        ck.save(step, {"w": torch.full((64,), float(step)), "meta": {"step": step}})
    name, damage = DAMAGE[kind]
    damage(tmp_path / "step_00000002" / "rank_0" / name)
    with pytest.raises(CheckpointError, match=name):
        ck.load(2)
    with caplog.at_level(logging.WARNING):
        assert ck.agree_resume_step(World()) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and name in warnings[0] and "step 2" in warnings[0] and "\n" not in warnings[0]
    assert torch.equal(ck.load(1)["w"], torch.full((64,), 1.0))


def test_no_good_step_anywhere_means_start_afresh(tmp_path, caplog):
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    assert ck.agree_resume_step(World()) is None
    ck.save(3, {"w": torch.ones(2)})
    (tmp_path / "step_00000003" / "rank_0" / "state.json").write_text("")
    with caplog.at_level(logging.WARNING):
        assert ck.agree_resume_step(World()) is None
    assert sum("starting afresh" in r.getMessage() for r in caplog.records) == 1  # said once, not silently


def test_ranks_saving_at_different_paces_leave_no_incomplete_step_dirs(tmp_path):
    fast, slow = (Checkpointer(tmp_path, rank=r, world_size=2, keep=2) for r in (0, 1))
    for step in (1, 2, 3, 4):  # the fast rank is done before the slow one starts
        fast.save(step, {"w": torch.ones(1)})
    for step in (1, 2, 3, 4):
        slow.save(step, {"w": torch.ones(1)})
    dirs = sorted(d.name for d in tmp_path.iterdir())
    assert dirs == ["step_00000003", "step_00000004"]
    assert all(sorted(p.name for p in (tmp_path / d).iterdir()) == ["rank_0", "rank_1"] for d in dirs)


def test_metrics_rows_after_the_resume_step_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "train/loss": 1.0 / s}) + "\n" for s in range(1, 9)) + "{torn")
    drop_rows_after(path, 5)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
