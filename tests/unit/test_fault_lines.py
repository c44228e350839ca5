"""Faults say so when they happen: a dead worker (survivor launcher), a torchft group that healed
(from which group, at which step). On the old code a SIGKILLed worker printed nothing until the
final summary, and a healed torchft group said nothing at all."""

import logging
import os

import pytest

from decentrain.core.launch.launcher import launch_survivors
from decentrain.core.world import World


def test_a_dead_worker_is_logged_when_it_dies_and_named_in_the_summary(tmp_path, caplog, monkeypatch):
    (tmp_path / "nu_worker.py").write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    with caplog.at_level(logging.WARNING, logger="decentrain.core.launch.launcher"):
        codes = launch_survivors([], 2, module="nu_worker", poll_s=0.05)
    assert codes == {0: 0, 1: 3}
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("worker died (rank 1: exit 3)") for m in lines), lines
    assert any("1 of 2 workers finished; failed: rank 1: exit 3" in m for m in lines)


def test_a_healed_torchft_group_says_from_which_group_at_which_step(monkeypatch, caplog):
    pytest.importorskip("torchft")
    import torchft

    from decentrain.algorithms.pretraining.torchft.manager import build_manager
    from decentrain.algorithms.pretraining.transports.torchft_groups import TorchFTConfig

    made = {}
    monkeypatch.setattr(torchft, "Manager", lambda **kw: made.update(kw) or "manager")
    monkeypatch.setattr(torchft, "ProcessGroupGloo", lambda **kw: None)
    loaded = []
    donor = build_manager(
        World(),
        TorchFTConfig(replica_id=0, lighthouse="http://x:1").replica_group(),
        lambda: {"step": 7, "w": 1},
        loaded.append,
    )
    assert donor == "manager"
    sent = made["state_dict"]()
    assert sent == {"step": 7, "w": 1, "healed_from_group": 0}
    made.clear()
    build_manager(
        World(), TorchFTConfig(replica_id=1, lighthouse="http://x:1").replica_group(), lambda: {}, loaded.append
    )
    with caplog.at_level(logging.WARNING):
        made["load_state_dict"](dict(sent))
    assert loaded == [{"step": 7, "w": 1}]  # the tag never reaches the trainer
    assert "replica group 1 healed from group 0 at step 7" in [
        r.getMessage().split("] ", 1)[-1] for r in caplog.records
    ]
