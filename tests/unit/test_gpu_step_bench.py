"""benchmarks/gpu_step.py: skips cleanly without CUDA; its --smoke path runs both loops anywhere."""

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_gpu_step_exits_zero_without_cuda(capsys):
    from benchmarks.gpu_step import main

    assert main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out
