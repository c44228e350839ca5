"""sapo_round_time: one SAPO node's round time beside TRL's GRPOTrainer, same model, batch and G.

Both sides: the SFT warm-start model, 8 questions x G completions, the same max completion
length, temperature, KL 0, one optimizer step per batch, token-mean (dapo) loss, one micro-batch.
Both stop a completion at "\\n" (TRL: "\\n" is made an EOS token of the model's generation config)
and see the same prompt tokens (TRL's plain-prompt path would append ByT5's </s>; the tokenizer
handed to TRL does not).
The node runs the full round: generate, exchange (a one-node hivemind DHT: a real publish and
fetch), re-tokenise and re-score, train. TRL's time is its `training_step` (generate, score, train).
Both run in this one process, in turn, on the same threads, after warm-up steps.

Each seed is one paired measurement (node, then TRL); the figures are the per-seed medians,
mean ± std over seeds. It uses sapo_swarm's warm start and task mix (trained first if not cached).

    python -m benchmarks.sapo_round_time
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, prompt_as_is_tokenizer
from benchmarks.harness import Harness, bench_parser, fmt, header, mean_std, parse, save_figure
from benchmarks.sapo_swarm import BenchConfig, sft_overrides, warm_start

QUESTIONS = 8


def task_mix():
    """sapo_swarm's mix: conf/task/<BenchConfig.task>.yaml."""
    import yaml

    from decentrain.tasks import TaskMixConfig

    conf = yaml.safe_load((ROOT / "conf" / "task" / f"{BenchConfig().task}.yaml").read_text())
    return TaskMixConfig(tasks=conf["tasks"], size=conf["size"], seed=conf["seed"], task_kwargs=conf["task_kwargs"])


def sapo_round_times(model_dir: Path, args: argparse.Namespace, run_dir: Path, seed: int) -> list[dict]:
    from decentrain.algorithms.sapo.batching import SwarmBatchConfig
    from decentrain.algorithms.sapo.config import RLLoopConfig, RLOptimConfig, SAPOConfig
    from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig, build_exchange
    from decentrain.algorithms.sapo.generation import SamplingConfig
    from decentrain.algorithms.sapo.grpo import SAPOLossConfig
    from decentrain.algorithms.sapo.node import SAPONode
    from decentrain.algorithms.sapo.payload import PayloadLimits
    from decentrain.core.world import World
    from decentrain.models.factory import ModelConfig

    cfg = SAPOConfig(
        model=ModelConfig(pretrained=str(model_dir), tokenizer=str(model_dir)),
        task=task_mix(),
        sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, batch_size=QUESTIONS * args.g),
        loss=SAPOLossConfig(num_generations=args.g, beta=0.0, loss_type="dapo"),
        payload=PayloadLimits(num_generations=args.g),
        batch=SwarmBatchConfig(QUESTIONS, 0),
        exchange=ExchangeConfig(name="hivemind", hivemind=HivemindConfig(wait_s=0.0, min_peers=0)),
        optim=RLOptimConfig(lr=args.lr),
        train=RLLoopConfig(rounds=args.steps, micro_batch_size=QUESTIONS * args.g, seed=seed),
    )
    exchange = build_exchange(cfg.exchange, World(), "node0")
    node = SAPONode(cfg, 0, "node0", exchange)
    try:
        return [node.run_round() for _ in range(args.warmup + args.steps)][args.warmup :]
    finally:
        exchange.close()


def trl_step_times(model_dir: Path, args: argparse.Namespace, run_dir: Path, seed: int) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from decentrain.tasks import PromptTemplate, TaskMixture, TemplateConfig, Verifier

    mixture = TaskMixture(task_mix())
    template = PromptTemplate(TemplateConfig())
    verifier = Verifier(template)
    n = QUESTIONS * (args.warmup + args.steps)
    items = [mixture[i] for i in range(n)]
    data = Dataset.from_list(
        [
            {"prompt": template(it.question), "task": it.task, "question": it.question, "answer": it.answer, "idx": i}
            for i, it in enumerate(items)
        ]
    )

    def reward(prompts, completions, idx, **_):
        return [verifier(items[i], c) for i, c in zip(idx, completions)]

    tokenizer = prompt_as_is_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, newline]  # stop at "\n", as the node does
    config = GRPOConfig(
        output_dir=str(run_dir),
        per_device_train_batch_size=QUESTIONS * args.g,
        num_generations=args.g,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        beta=0.0,
        loss_type="dapo",
        learning_rate=args.lr,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        shuffle_dataset=False,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Timer()],
    )
    trainer.train()
    return times[args.warmup :]


def run_seed(job: dict) -> dict:
    """One paired measurement: the node's rounds, then TRL's steps, in this process on the same threads."""
    args = argparse.Namespace(**job["args"])
    torch.set_num_threads(args.threads)
    torch.manual_seed(job["seed"])
    model_dir = ROOT / job["model_dir"]
    run_dir = ROOT / "runs" / "bench" / "sapo_round_time" / f"seed{job['seed']}"
    rounds = sapo_round_times(model_dir, args, run_dir, job["seed"])
    trl = trl_step_times(model_dir, args, run_dir / "trl", job["seed"])
    return {
        "decentrain_round_s": [r["time_round"] for r in rounds],
        "decentrain_split_s": {k: [r[f"time_{k}"] for r in rounds] for k in ("generate", "exchange", "train")},
        "decentrain_trained_completions": [r.get("trained_completions", 0.0) for r in rounds],
        "trl_step_s": trl,
    }


def main() -> None:
    ap = bench_parser(__doc__.splitlines()[0])
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    args = parse(ap)
    nseeds, allow_dirty, fresh = args.seeds, args.allow_dirty, args.fresh
    bench = BenchConfig()  # the sapo_swarm warm start, task mix and completion length
    cfg = {
        "g": args.g,
        "steps": args.steps,
        "warmup": args.warmup,
        "lr": args.lr,
        "threads": args.threads,
        "max_new_tokens": bench.max_new_tokens,
        "task": bench.task,
        "questions": QUESTIONS,
    }
    hz = Harness(
        "sapo_round_time",
        __file__,
        {**cfg, "seeds": list(range(nseeds)), "sft_overrides": sft_overrides(bench)},
        allow_dirty=allow_dirty,
        fresh=fresh,
        smoke=args.smoke,
    )
    model_dir, _ = warm_start(bench)
    model_rel = model_dir.relative_to(ROOT).as_posix()
    runs = hz.run_jobs(
        [{"args": cfg, "seed": s, "model_dir": model_rel} for s in range(nseeds)], run_seed, desc="sapo round time"
    )
    med = statistics.median
    figures = {
        "decentrain_median_round_s": mean_std([med(r["decentrain_round_s"]) for r in runs]),
        "decentrain_median_split_s": {
            k: mean_std([med(r["decentrain_split_s"][k]) for r in runs]) for k in ("generate", "exchange", "train")
        },
        "trl_median_step_s": mean_std([med(r["trl_step_s"]) for r in runs]),
        "ratio": mean_std([med(r["decentrain_round_s"]) / med(r["trl_step_s"]) for r in runs]),
        "per_seed": runs,
    }
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


def text(rec: dict) -> str:
    f, c = rec["figures"], rec["config"]
    sp = f["decentrain_median_split_s"]
    return "\n".join(
        [
            header(rec),
            "",
            f"{c['questions']} questions x G={c['g']}, max {c['max_new_tokens']} new tokens, {c['threads']} threads, "
            f"{c['steps']} timed steps after {c['warmup']} warm-up, per seed the median; mean ± std over "
            f"{len(c['seeds'])} seeds",
            "",
            "| | median s per round / step | generate | exchange | train (+score) |",
            "|---|---|---|---|---|",
            f"| decentrain node | {fmt(f['decentrain_median_round_s'], 3)} | {fmt(sp['generate'], 3)} | "
            f"{fmt(sp['exchange'], 3)} | {fmt(sp['train'], 3)} |",
            f"| TRL GRPOTrainer | {fmt(f['trl_median_step_s'], 3)} | | | |",
            "",
            f"ratio decentrain / TRL = {fmt(f['ratio'], 2)}x (per seed "
            f"{', '.join(f'{v:.2f}' for v in f['ratio']['values'])})",
        ]
    )


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f, c = rec["figures"], rec["config"]
    sp = f["decentrain_median_split_s"]
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = 0.0
    for k, label in (("generate", "generate"), ("exchange", "exchange"), ("train", "train (+score)")):
        ax.bar(["decentrain"], [sp[k]["mean"]], bottom=[bottom], label=label)
        bottom += sp[k]["mean"]
    ax.errorbar(
        ["decentrain"],
        [f["decentrain_median_round_s"]["mean"]],
        yerr=[f["decentrain_median_round_s"]["std"]],
        color="k",
        capsize=4,
    )
    ax.bar(
        ["TRL GRPOTrainer"],
        [f["trl_median_step_s"]["mean"]],
        yerr=[f["trl_median_step_s"]["std"]],
        capsize=4,
        label="TRL step",
    )
    ax.set(
        ylabel="median seconds per round / step (mean ± std over seeds)",
        title=f"{c['questions']} questions x G={c['g']}, CPU: ratio {fmt(f['ratio'], 2)}x",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png, dpi=120)


if __name__ == "__main__":
    main()
