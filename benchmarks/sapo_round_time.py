"""sapo_round_time: one SAPO node's round time beside TRL's GRPOTrainer, same model, batch and G.

Both sides: the SFT warm-start model, 8 questions x G completions, the same max completion
length, temperature, KL 0, one optimizer step per batch, token-mean (dapo) loss, one micro-batch.
Both stop a completion at "\\n" (TRL: "\\n" is made an EOS token of the model's generation config)
and see the same prompt tokens (TRL's plain-prompt path would append ByT5's </s>; the tokenizer
handed to TRL does not).
The node runs the full round: generate, exchange (a one-node hivemind DHT: a real publish and
fetch), re-tokenise and re-score, train. TRL's time is its `training_step` (generate, score, train).
Both run in this one process, in turn, on the same threads, after warm-up steps.

    python -m benchmarks.sapo_round_time
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.results_io import RESULTS, write_results
from benchmarks.sapo_swarm import ROOT, warm_start

QUESTIONS = 8


def sapo_round_times(model_dir: Path, args: argparse.Namespace, run_dir: Path) -> list[dict]:
    from decentrain.algorithms.sapo.batching import SwarmBatchConfig
    from decentrain.algorithms.sapo.config import RLLoopConfig, RLOptimConfig, SAPOConfig
    from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig, build_exchange
    from decentrain.algorithms.sapo.generation import SamplingConfig
    from decentrain.algorithms.sapo.grpo import SAPOLossConfig
    from decentrain.algorithms.sapo.node import SAPONode
    from decentrain.algorithms.sapo.payload import PayloadLimits
    from decentrain.core.world import World
    from decentrain.models.factory import ModelConfig
    from decentrain.tasks import TaskMixConfig

    import yaml

    task = yaml.safe_load((ROOT / "conf" / "task" / "arith_legs.yaml").read_text())
    task.pop("defaults")
    cfg = SAPOConfig(
        model=ModelConfig(pretrained=str(model_dir), tokenizer=str(model_dir)),
        task=TaskMixConfig(**task),
        sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, batch_size=QUESTIONS * args.g),
        loss=SAPOLossConfig(num_generations=args.g, beta=0.0, loss_type="dapo"),
        payload=PayloadLimits(num_generations=args.g),
        batch=SwarmBatchConfig(QUESTIONS, 0),
        exchange=ExchangeConfig(name="hivemind", hivemind=HivemindConfig(wait_s=0.0, min_peers=0)),
        optim=RLOptimConfig(lr=args.lr),
        train=RLLoopConfig(rounds=args.steps, micro_batch_size=QUESTIONS * args.g),
    )
    exchange = build_exchange(cfg.exchange, World(), "node0")
    node = SAPONode(cfg, 0, "node0", exchange)
    try:
        return [node.run_round() for _ in range(args.warmup + args.steps)][args.warmup:]
    finally:
        exchange.close()


def trl_step_times(model_dir: Path, args: argparse.Namespace, run_dir: Path) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from decentrain.tasks import PromptTemplate, TaskMixConfig, TaskMixture, TemplateConfig, Verifier

    import yaml

    task = yaml.safe_load((ROOT / "conf" / "task" / "arith_legs.yaml").read_text())
    task.pop("defaults")
    mixture = TaskMixture(TaskMixConfig(**task))
    template = PromptTemplate(TemplateConfig())
    verifier = Verifier(template)
    n = QUESTIONS * (args.warmup + args.steps)
    items = [mixture[i] for i in range(n)]
    data = Dataset.from_list([{"prompt": template(it.question), "task": it.task, "question": it.question,
                               "answer": it.answer, "idx": i} for i, it in enumerate(items)])

    def reward(prompts, completions, idx, **_):
        return [verifier(items[i], c) for i, c in zip(idx, completions)]

    class PromptAsIs(type(AutoTokenizer.from_pretrained(model_dir))):
        """TRL tokenizes plain prompts with special tokens; ByT5 would append </s>. The node does not."""

        def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
            return token_ids_0 + (token_ids_1 or [])

    tokenizer = PromptAsIs.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, newline]  # stop at "\n", as the node does
    config = GRPOConfig(
        output_dir=str(run_dir), per_device_train_batch_size=QUESTIONS * args.g, num_generations=args.g,
        max_completion_length=args.max_new_tokens, temperature=1.0, beta=0.0, loss_type="dapo", learning_rate=args.lr,
        max_steps=args.warmup + args.steps, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
        shuffle_dataset=False, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[Timer()])
    trainer.train()
    return times[args.warmup:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=str(ROOT / ".cache"))
    ap.add_argument("--name", default="sapo_round_time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir, _ = warm_start(args)
    run_dir = ROOT / "runs" / "bench" / args.name
    # Alternate which goes first is not possible within one process budget; TRL goes second so
    # it benefits from any warmed caches (a conservative order for the ratio).
    rounds = sapo_round_times(model_dir, args, run_dir)
    trl = trl_step_times(model_dir, args, run_dir / "trl")
    split = {k: statistics.median(r[f"time_{k}"] for r in rounds) for k in ("generate", "exchange", "train", "round")}
    trl_median = statistics.median(trl)
    figures = {
        "decentrain_round_s": [r["time_round"] for r in rounds], "decentrain_median_split_s": split,
        "decentrain_trained_completions": [r.get("trained_completions", 0.0) for r in rounds],
        "trl_step_s": trl, "trl_median_s": trl_median, "ratio": split["round"] / trl_median,
    }
    out = write_results(args.name, vars(args), figures)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(["decentrain"], [split["generate"]], label="generate")
    ax.bar(["decentrain"], [split["exchange"]], bottom=[split["generate"]], label="exchange")
    ax.bar(["decentrain"], [split["train"]], bottom=[split["generate"] + split["exchange"]], label="train (+score)")
    ax.bar(["TRL GRPOTrainer"], [trl_median], label="TRL step")
    ax.set(ylabel="median seconds per round / step", title=f"{QUESTIONS} questions x G={args.g}, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.name}.png", dpi=120)
    plt.close(fig)

    print("\n| | median s | generate | exchange | train |")
    print("|---|---|---|---|---|")
    print(f"| decentrain node | {split['round']:.3f} | {split['generate']:.3f} | {split['exchange']:.3f} | {split['train']:.3f} |")
    print(f"| TRL GRPOTrainer | {trl_median:.3f} | | | |")
    print(f"\nratio decentrain / TRL = {figures['ratio']:.2f}x  (steps {args.steps}, warm-up {args.warmup})")
    print(f"wrote {out} and {RESULTS / (args.name + '.png')}")


if __name__ == "__main__":
    main()
