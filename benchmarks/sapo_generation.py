"""SAPO rollout speed: decentrain's generation backend against a bare `model.generate`, same model and batch.

Model: a random model of Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, FFN 4864,
vocab 151,936, tied embeddings), the shape the earlier H100 probe used. Batch: `prompts` x `generations`
rows (64 by default), prompts of 32-64 random bytes, `max_new_tokens` new tokens each (256). EOS is
switched off, so every row generates exactly max_new_tokens and new tokens/s = rows x max_new_tokens / s.

Loops (each warmed up once, then timed `repeats` times per seed, the device synchronized around each call):
- `bare_fp32`: `model.generate` on the trained model as SAPO ran it before (fp32 weights, dynamic cache);
- `bare_bf16`: `model.generate` on a bf16 copy, dynamic cache (the probe's 3.2k tokens/s loop);
- `decentrain`: `HFGenerationBackend.generate` with the defaults (CUDA: bf16 copy refreshed from the
  fp32 policy, static cache compiled by transformers, fixed shapes), tokenizing and decoding included;
- `decentrain_vllm`: the vLLM backend, when vllm is installed (skipped otherwise).
Target: decentrain >= 3x bare_fp32 new tokens/s (issue 19).

Departure: prompts are random bytes and the model is random (no checkpoint can be downloaded on
the offline GPU machine); sampling is plain (temperature 1, top_p 1), no stop string.

    python -m benchmarks.sapo_generation                 # CUDA: writes results/sapo_generation.{json,txt,png}
    python -m benchmarks.sapo_generation --smoke         # tiny model, any device; writes nothing

Without CUDA (and without --smoke) it prints why and exits 0.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
from transformers import AutoModelForCausalLM, ByT5Tokenizer

from benchmarks.harness import Harness, bench_parser, own_flags, parse, save_figure
from decentrain.algorithms.sapo.generation import SamplingConfig, build_generation_backend
from decentrain.models.factory import ModelConfig, hf_config

LOOPS = ("bare_fp32", "bare_bf16", "decentrain", "decentrain_vllm")


@dataclass
class GenBenchConfig:
    hidden_size: int = 896
    num_layers: int = 24
    num_heads: int = 14
    num_kv_heads: int = 2
    intermediate_size: int = 4864
    vocab_size: int = 151_936
    prompts: int = 8
    generations: int = 8
    prompt_bytes: int = 64
    max_new_tokens: int = 256
    repeats: int = 2
    seeds: int = 3
    smoke: bool = False
    loops: list[str] = field(default_factory=lambda: list(LOOPS))

    @property
    def rows(self) -> int:
        return self.prompts * self.generations


class WideByteTokenizer(ByT5Tokenizer):
    """ByT5's byte tokenizer that decodes ids beyond its 384 (a random model with a 151k vocab
    samples them) as bytes, so decoding costs what it costs for a real tokenizer."""

    def _convert_id_to_token(self, index: int) -> str:
        return super()._convert_id_to_token(index if index < 259 else 3 + (index - 3) % 256)  # 259+: bytes again


def build(b: GenBenchConfig, device: torch.device):
    mc = ModelConfig(
        family="qwen2",
        hidden_size=b.hidden_size,
        num_layers=b.num_layers,
        num_heads=b.num_heads,
        num_kv_heads=b.num_kv_heads,
        intermediate_size=b.intermediate_size,
        max_seq_len=4096,
        tie_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(hf_config(mc, b.vocab_size), dtype=torch.float32).to(device)
    model.generation_config.eos_token_id = None  # every row runs to max_new_tokens
    return model


def make_prompts(b: GenBenchConfig, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(b.prompt_bytes // 2, b.prompt_bytes + 1, (b.prompts,), generator=g)
    return ["".join(chr(97 + int(c)) for c in torch.randint(0, 26, (int(n),), generator=g)) for n in lengths]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_generate(model, tok, prompts: list[str], b: GenBenchConfig, device: torch.device, seed: int) -> None:
    flat = [p for p in prompts for _ in range(b.generations)]
    enc = tok(flat, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt").to(device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.generate(
            **enc,
            max_new_tokens=b.max_new_tokens,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            use_cache=True,
            pad_token_id=tok.pad_token_id,
        )


def time_loop(loop: str, model, tok, b: GenBenchConfig, device: torch.device, seed: int) -> list[float]:
    """Seconds per call after one warm-up call (compilation, cache allocation)."""
    if loop == "bare_fp32":
        call = lambda p, s: bare_generate(model, tok, p, b, device, s)  # noqa: E731
    elif loop == "bare_bf16":
        bf16 = build(b, device).to(torch.bfloat16)
        bf16.load_state_dict(model.state_dict())
        call = lambda p, s: bare_generate(bf16, tok, p, b, device, s)  # noqa: E731
    else:
        cfg = SamplingConfig(
            max_new_tokens=b.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            stop=None,
            batch_size=b.rows,
            backend="vllm" if loop == "decentrain_vllm" else "hf",
        )
        backend = build_generation_backend(model, tok, cfg)
        call = lambda p, s: backend.generate(p, b.generations, seed=s)  # noqa: E731
    call(make_prompts(b, 10_000 + seed), seed)
    out = []
    for r in range(b.repeats):
        prompts = make_prompts(b, seed * 100 + r)
        _sync(device)
        t = time.perf_counter()
        call(prompts, seed * 100 + r)
        _sync(device)
        out.append(time.perf_counter() - t)
    return out


def measure(b: GenBenchConfig) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = WideByteTokenizer()
    loops = [
        x for x in b.loops if x != "decentrain_vllm" or (importlib.util.find_spec("vllm") and device.type == "cuda")
    ]
    tokens = b.rows * b.max_new_tokens
    rows = []
    for seed in range(b.seeds):
        torch.manual_seed(seed)
        model = build(b, device)
        row: dict = {"seed": seed}
        for loop in loops:
            secs = statistics.median(time_loop(loop, model, tok, b, device, seed))
            row[f"{loop}_s"] = secs
            row[f"{loop}_tokens_per_s"] = tokens / secs
            print(f"seed {seed} {loop}: {tokens / secs:,.0f} new tokens/s ({secs:.2f} s)", flush=True)
        row["speedup_vs_bare_fp32"] = (
            row["decentrain_tokens_per_s"] / row["bare_fp32_tokens_per_s"] if "bare_fp32" in loops else None
        )
        row["speedup_vs_bare_bf16"] = (
            row["decentrain_tokens_per_s"] / row["bare_bf16_tokens_per_s"] if "bare_bf16" in loops else None
        )
        rows.append(row)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "new_tokens_per_call": tokens,
        "loops": loops,
        "seeds": rows,
    }
    for key in [f"{x}_tokens_per_s" for x in loops] + ["speedup_vs_bare_fp32", "speedup_vs_bare_bf16"]:
        vals = [r[key] for r in rows if r.get(key) is not None]
        if vals:
            out[key] = {
                "mean": statistics.fmean(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "n": len(vals),
            }
    return out


def text_table(fig: dict) -> str:
    lines = [
        f"sapo_generation on {fig['device']}: {fig['new_tokens_per_call']} new tokens per call",
        f"{'loop':>16} | {'new tokens/s (mean ± std over seeds)':>38}",
    ]
    for loop in fig["loops"]:
        m = fig[f"{loop}_tokens_per_s"]
        lines.append(f"{loop:>16} | {m['mean']:>18,.0f} ± {m['std']:<,.0f}")
    for key, target in (("speedup_vs_bare_fp32", " (target >= 3)"), ("speedup_vs_bare_bf16", "")):
        if key in fig:
            lines.append(f"decentrain {key.replace('_', ' ')} = {fig[key]['mean']:.2f} ± {fig[key]['std']:.2f}{target}")
    return "\n".join(lines)


def plot(fig: dict, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f, ax = plt.subplots(figsize=(6.5, 3.5))
    loops = fig["loops"]
    ax.bar(
        loops,
        [fig[f"{x}_tokens_per_s"]["mean"] for x in loops],
        yerr=[fig[f"{x}_tokens_per_s"]["std"] for x in loops],
        capsize=4,
    )
    ax.set_ylabel("new tokens/s (mean ± std over seeds)")
    ax.set_title(f"SAPO generation, {fig['device']}")
    f.tight_layout()
    save_figure(f, out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, seeds=GenBenchConfig.seeds)
    for name in ("prompts", "generations", "prompt_bytes", "max_new_tokens", "repeats"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(GenBenchConfig, name))
    p.add_argument("--loops", nargs="+", default=list(LOOPS), choices=LOOPS)
    args = parse(p, argv)  # --smoke: tiny model, a few tokens, any device; writes no results
    b = GenBenchConfig(**own_flags(args), smoke=args.smoke)
    if "decentrain" not in b.loops:
        b.loops.append("decentrain")
    if b.smoke:
        b.hidden_size, b.num_layers, b.num_heads, b.num_kv_heads, b.intermediate_size, b.vocab_size = (
            32,
            2,
            2,
            1,
            64,
            1000,
        )
        b.prompts, b.generations, b.prompt_bytes, b.max_new_tokens, b.repeats, b.seeds = 2, 2, 16, 8, 1, 1
    elif not torch.cuda.is_available():
        print("sapo_generation: no CUDA device here; nothing measured (run it on a GPU machine, or --smoke)")
        return 0
    hz = (
        None
        if b.smoke
        else Harness("sapo_generation", __file__, asdict(b), allow_dirty=args.allow_dirty, fresh=args.fresh)
    )
    fig = measure(b)
    print(text_table(fig))
    if hz is None:
        return 0
    hz.write(fig, lambda rec: text_table(rec["figures"]), lambda rec, png: plot(rec["figures"], png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
