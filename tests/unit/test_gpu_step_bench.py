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

    fig = {
        "device": "X",
        "new_tokens_per_call": 64,
        "loops": ["bare_fp32", "decentrain"],
        "bare_fp32_tokens_per_s": {"mean": 1000.0, "std": 10.0},
        "decentrain_tokens_per_s": {"mean": 3500.0, "std": 20.0},
        "speedup_vs_bare_fp32": {"mean": 3.5, "std": 0.1},
    }
    text = text_table(fig)
    assert "3,500" in text and "speedup vs bare fp32 = 3.50" in text and "target >= 3" in text


def test_wide_byte_tokenizer_decodes_ids_beyond_its_vocabulary():
    from benchmarks.sapo_generation import WideByteTokenizer

    tok = WideByteTokenizer()
    # ByT5 would raise "bytes must be in range(0, 256)" on 151,000 + 3 + 97 * 1 (a byte 'a' again)
    assert tok.batch_decode([[3 + 97, 3 + 97 + 256 * 589]], skip_special_tokens=True) == ["aa"]


# -- gpu_step's interval and stopping rule, on synthetic window timings ----------------------
def _cfg(**kw):
    from benchmarks.gpu_step import BenchConfig

    return BenchConfig(**{"min_windows": 8, "max_windows": 60, "target": 0.03, "budget_s": 100.0, **kw})


def _pairs(ratio: float, sd: float, n: int, seed: int = 0) -> list[tuple[float, float]]:
    """n window pairs (decentrain_s, bare_s): bare drifts (clock, neighbours), decentrain = bare x ratio x noise."""
    gen = torch.Generator().manual_seed(seed)
    bare = 0.030 * torch.exp(0.2 * torch.randn(n, generator=gen))  # a 20 % drift both loops share
    noise = torch.exp(sd * torch.randn(n, generator=gen))
    return [(float(b * ratio * e), float(b)) for b, e in zip(bare, noise)]


def test_interval_covers_the_true_ratio_and_shrinks_with_windows():
    from benchmarks.gpu_step import ratio_interval

    few, many = ratio_interval(_pairs(1.02, 0.03, 6)), ratio_interval(_pairs(1.02, 0.03, 60))
    assert few["ci95"][0] < 1.02 < few["ci95"][1] and many["ci95"][0] < 1.02 < many["ci95"][1]
    assert many["half_width"] < few["half_width"] and many["half_width"] < 0.03
    # the shared drift cancels in the paired ratio: 20 % drift, yet a 1.6 % interval at 60 windows
    assert many["half_width"] < 0.02
    assert ratio_interval(_pairs(1.02, 0.03, 1))["ci95"] is None


def test_interval_is_symmetric_in_which_loop_is_on_top():
    from benchmarks.gpu_step import ratio_interval

    pairs = _pairs(1.05, 0.04, 20)
    up, down = ratio_interval(pairs), ratio_interval([(b, d) for d, b in pairs])
    assert up["ratio"] == pytest.approx(1 / down["ratio"])
    assert up["ci95"][0] == pytest.approx(1 / down["ci95"][1]) and up["ci95"][1] == pytest.approx(1 / down["ci95"][0])


def test_windows_are_added_until_the_interval_is_within_3_percent():
    from benchmarks.gpu_step import ratio_interval, stop_reason

    b = _cfg()
    pairs = _pairs(0.98, 0.05, 60, seed=3)
    stopped = next(n for n in range(1, 61) if stop_reason(pairs[:n], b, elapsed_s=1.0))
    assert stopped >= b.min_windows
    assert "decided" in stop_reason(pairs[:stopped], b, 1.0)
    assert ratio_interval(pairs[:stopped])["half_width"] <= 0.03 < ratio_interval(pairs[: stopped - 1])["half_width"]


def test_identical_windows_stop_at_the_minimum_and_never_before():
    from benchmarks.gpu_step import stop_reason

    b = _cfg(min_windows=5)
    same = [(0.031, 0.030)] * 10
    assert [stop_reason(same[:n], b, 1.0) is not None for n in range(1, 7)] == [False] * 4 + [True, True]


def test_noisy_windows_stop_at_the_window_ceiling_or_the_budget():
    from benchmarks.gpu_step import stop_reason

    noisy = _pairs(1.0, 0.5, 60, seed=1)
    assert "max windows" in stop_reason(noisy[:12], _cfg(max_windows=12), 1.0)
    assert stop_reason(noisy[:11], _cfg(max_windows=12), 1.0) is None
    assert "budget" in stop_reason(noisy[:11], _cfg(max_windows=12, budget_s=30.0), elapsed_s=30.5)


def test_gpu_step_smoke_interleaves_both_loops_on_cpu(capsys):
    from benchmarks.gpu_step import main

    assert main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "loops interleaved window by window" in out and "95 % interval" in out and "window pairs" in out
