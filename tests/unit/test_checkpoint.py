import os
import signal
import subprocess
import sys
import textwrap

import torch

from decentrain.core.checkpoint import Checkpointer


def _state(step: int) -> dict:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "extra": {"tags": ["a", 1], "x": 0.5},
    }


def test_roundtrip_keeps_tensors_ints_and_nested_values(tmp_path):
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    state = _state(7)
    ck.save(7, state)
    loaded = ck.load(ck.latest())
    assert loaded["step"] == 7 and loaded["extra"] == {"tags": ["a", 1], "x": 0.5}
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v)
    assert set(loaded["optimizer"]["state"]) == {0, 1}  # int param keys survive
    opt = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.1)
    opt.load_state_dict(loaded["optimizer"])


def test_step_is_complete_only_when_every_rank_wrote(tmp_path):
    Checkpointer(tmp_path, rank=0, world_size=2).save(5, {"a": torch.ones(1)})
    assert Checkpointer(tmp_path, rank=1, world_size=2).latest() is None
    Checkpointer(tmp_path, rank=1, world_size=2).save(5, {"a": torch.ones(1)})
    assert Checkpointer(tmp_path, rank=0, world_size=2).latest() == 5


def test_prune_keeps_the_newest(tmp_path):
    ck = Checkpointer(tmp_path, rank=0, world_size=1, keep=2)
    for s in (1, 2, 3, 4):
        ck.save(s, {"a": torch.full((1,), float(s))})
    assert ck.complete_steps() == [3, 4]


def test_a_save_killed_half_way_leaves_the_previous_checkpoint_loadable(tmp_path):
    # the child saves step 1, then dies by SIGKILL right after writing step 2's tensors
    script = textwrap.dedent(f"""
        import os, signal, torch, safetensors.torch as st
        import decentrain.core.checkpoint as ckpt
        ck = ckpt.Checkpointer({str(tmp_path)!r}, rank=0, world_size=1)
        ck.save(1, {{"w": torch.ones(4)}})
        real = ckpt.save_file
        def dying_save(tensors, path):
            real(tensors, path)
            os.kill(os.getpid(), signal.SIGKILL)
        ckpt.save_file = dying_save
        ck.save(2, {{"w": torch.zeros(4)}})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    ck = Checkpointer(tmp_path, rank=0, world_size=1)
    assert ck.latest() == 1
    assert torch.equal(ck.load(1)["w"], torch.ones(4))
    assert any(p.name.startswith(".tmp-") for p in (tmp_path / "step_00000002").iterdir())
    ck.save(2, {"w": torch.full((4,), 2.0)})  # the next save clears the debris
    assert ck.latest() == 2 and not any(p.name.startswith(".tmp-") for p in (tmp_path / "step_00000002").iterdir())
    assert os.path.exists(tmp_path / "step_00000002" / "rank_0" / "tensors.safetensors")
