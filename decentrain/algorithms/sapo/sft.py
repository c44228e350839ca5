"""Warm start for SAPO: supervised fine-tuning on the task format, loss on answer tokens only.

A tiny model from scratch earns no reward, so RL has no signal. Training it on
`template(question) + answer + stop` with the question masked out gives it enough sampled
accuracy (a few %) that some groups have mixed rewards; the loss over the whole text does not.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from decentrain.algorithms.sapo.batching import pad_sequences
from decentrain.algorithms.sapo.config import SFTConfig
from decentrain.algorithms.sapo.generation import HFGenerationBackend
from decentrain.algorithms.sapo.prompts import answer_target, build_template
from decentrain.algorithms.sapo.sampling import SamplingConfig
from decentrain.core.metrics import MetricsLogger
from decentrain.core.world import local_world
from decentrain.models.factory import build_model, build_tokenizer, num_params, save_model
from decentrain.models.lora import trainable_parameters
from decentrain.tasks import PromptTemplate, TaskItem, TaskMixConfig, TaskMixture, Verifier

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


def encode_example(
    item: TaskItem, template: PromptTemplate, tokenizer: Any, max_prompt_tokens: int = 256
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) with labels = IGNORE_INDEX on the prompt: only the answer (and what ends it:
    the stop string, or a chat model's end-of-turn token) is learned."""
    prompt = tokenizer(template(item.question), add_special_tokens=False)["input_ids"][-max_prompt_tokens:]
    answer = tokenizer(answer_target(template, item.answer), add_special_tokens=False)["input_ids"]
    return prompt + answer, [IGNORE_INDEX] * len(prompt) + answer


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    ids, mask = pad_sequences([e[0] for e in examples], pad_id, left=False)
    labels, _ = pad_sequences([e[1] for e in examples], IGNORE_INDEX, left=False)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def answer_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    logits, labels = logits[:, :-1].float(), batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE_INDEX
    )


@torch.no_grad()
def evaluate_accuracy(
    model: Any,
    tokenizer: Any,
    task_cfg: TaskMixConfig,
    template: PromptTemplate,
    sampling: SamplingConfig,
    prompts_per_task: int,
    num_generations: int,
    seed: int,
) -> dict[str, Any]:
    """Per-task sampled accuracy (G completions per prompt, as RL sees it), mixed-reward prompts, greedy accuracy."""
    verifier = Verifier(template)
    out: dict[str, Any] = {}
    for task in task_cfg.tasks:
        cfg = TaskMixConfig(
            tasks=[task],
            size=max(prompts_per_task, 1),
            seed=seed,
            task_kwargs={task: task_cfg.task_kwargs.get(task, {})},
        )
        mixture = TaskMixture(cfg)
        items = [mixture[i] for i in range(prompts_per_task)]
        prompts = [template(it.question) for it in items]
        sampled = HFGenerationBackend(model, tokenizer, sampling).generate(prompts, num_generations, seed=seed)
        greedy_cfg = SamplingConfig(**{**sampling.__dict__, "temperature": 0.0})
        greedy = HFGenerationBackend(model, tokenizer, greedy_cfg).generate(prompts, 1, seed=seed)
        # Accuracy counts exact answers; reasoning-gym gives partial credit (e.g. 0.01) to some wrong ones.
        scores = np.array(
            [[verifier.correctness(it, c) >= 1.0 for c in comps] for it, comps in zip(items, sampled)], dtype=float
        )
        out[task] = {
            "sampled_accuracy": float(scores.mean()),
            "mixed_groups": int((scores.max(1) != scores.min(1)).sum()),
            "greedy_accuracy": float(np.mean([verifier.correctness(it, g[0]) >= 1.0 for it, g in zip(items, greedy)])),
            "prompts": prompts_per_task,
        }
    return out


def _lr_at(step: int, cfg) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))  # cosine to 10%


def run_sft(cfg: SFTConfig, run_dir: Path) -> dict[str, Any]:
    """Train, evaluate per task, `save_pretrained` to `cfg.out_dir`; returns the summary (also sft_eval.json)."""
    run_dir = Path(run_dir)
    out_dir = Path(cfg.out_dir) if cfg.out_dir else run_dir / "model"
    device = local_world(cfg.sft.device, cfg.sft.threads).device
    torch.manual_seed(cfg.sft.seed)
    tokenizer = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tokenizer).to(device)
    template = build_template(cfg.template, tokenizer)
    mixture = TaskMixture(cfg.task)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay)
    rng = np.random.default_rng(cfg.sft.seed)
    log = MetricsLogger(cfg.logger, run_dir, rank=0, total_steps=cfg.sft.steps)
    # a line answer stops at the stop string, a chat turn at its end-of-turn token
    sampling = template.sampling(cfg.sampling)
    start = time.perf_counter()
    model.train()
    try:
        for step in range(cfg.sft.steps):
            examples = [encode_example(it, template, tokenizer) for it in mixture.sample(cfg.sft.batch_size, rng)]
            batch = collate(examples, pad_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, cfg.sft)
            loss = answer_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            log.advance(1, loss=loss.item())
            if step + 1 == min(10, cfg.sft.steps):  # measured, then extrapolated: the default SFT takes minutes
                per_step = (time.perf_counter() - start) / (step + 1)
                logger.info(
                    "SFT: %d steps at %.2f s/step here: about %.0f min in all, then the per-task evaluation",
                    cfg.sft.steps,
                    per_step,
                    per_step * cfg.sft.steps / 60,
                )
            if (step + 1) % cfg.sft.log_every == 0 or step + 1 == cfg.sft.steps:
                log.log(step + 1, {"loss": loss.item(), "lr": optimizer.param_groups[0]["lr"]})
        train_s = time.perf_counter() - start
        accuracy = evaluate_accuracy(
            model,
            tokenizer,
            cfg.task,
            template,
            sampling,
            cfg.eval.prompts_per_task,
            cfg.eval.num_generations,
            cfg.task.seed + cfg.eval.seed_offset,
        )
    finally:
        log.close()
    save_model(model, tokenizer, out_dir)
    summary = {
        "out_dir": str(out_dir),
        "params": num_params(model),
        "steps": cfg.sft.steps,
        "final_loss": loss.item(),
        "train_s": train_s,
        "accuracy": accuracy,
    }
    (run_dir / "sft_eval.json").write_text(json.dumps(summary, indent=1))
    return summary
