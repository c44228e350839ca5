"""benchmarks/gpu_step.py: skips cleanly without CUDA; its --smoke path runs both loops anywhere."""

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_gpu_step_exits_zero_without_cuda(capsys):
    from benchmarks.gpu_step import main

    assert main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_sapo_generation_bench_exits_zero_without_cuda(capsys):
    from benchmarks.sapo_generation import main

    assert main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_sapo_generation_bench_table_reads_its_figures():
    from benchmarks.sapo_generation import text_table

    fig = {"device": "X", "new_tokens_per_call": 64, "loops": ["bare_fp32", "decentrain"],
           "bare_fp32_tokens_per_s": {"mean": 1000.0, "std": 10.0}, "decentrain_tokens_per_s": {"mean": 3500.0, "std": 20.0},
           "speedup_vs_bare_fp32": {"mean": 3.5, "std": 0.1}}
    text = text_table(fig)
    assert "3,500" in text and "speedup vs bare fp32 = 3.50" in text and "target >= 3" in text


def test_wide_byte_tokenizer_decodes_ids_beyond_its_vocabulary():
    from benchmarks.sapo_generation import WideByteTokenizer

    tok = WideByteTokenizer()
    # ByT5 would raise "bytes must be in range(0, 256)" on 151,000 + 3 + 97 * 1 (a byte 'a' again)
    assert tok.batch_decode([[3 + 97, 3 + 97 + 256 * 589]], skip_special_tokens=True) == ["aa"]
