"""A device layout the node cannot serve fails before any worker starts, in one line."""

from __future__ import annotations

import pytest
import torch

from decentrain.testing import run_train

pytestmark = pytest.mark.integration


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_requested_without_gpu_is_refused_before_workers(tmp_path):
    proc = run_train(tmp_path / "run", "experiment=ddp_cpu", "train.device=cuda", ok=False, timeout=120)
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith("config error: train.device=cuda but no CUDA GPU is visible to 2 local rank(s)"), err
    assert "ChildFailedError" not in proc.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()
