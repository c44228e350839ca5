"""SFT warm start: the loss covers answer tokens only; the saved checkpoint loads for SAPO."""

import json

import torch
from transformers import ByT5Tokenizer

from decentrain.algorithms.sapo.config import SFTConfig, SFTEvalConfig, SFTLoopConfig
from decentrain.algorithms.sapo.generation import SamplingConfig
from decentrain.algorithms.sapo.sft import IGNORE_INDEX, answer_loss, collate, encode_example, run_sft
from decentrain.core.metrics import LoggerConfig
from decentrain.models.factory import ModelConfig, build_model
from decentrain.tasks import PromptTemplate, TaskItem, TaskMixConfig, TemplateConfig
from decentrain.testing import EASY_TASKS, TINY_MODEL


def test_labels_cover_answer_and_stop_only():
    tok = ByT5Tokenizer()
    template = PromptTemplate(TemplateConfig())
    ids, labels = encode_example(TaskItem("chain_sum", "1 + 2 =", "3"), template, tok)
    learned = [t for t, label in zip(ids, labels) if label != IGNORE_INDEX]
    assert tok.decode(learned) == "3\n"
    assert tok.decode(ids) == "Q: 1 + 2 =\nA: 3\n"


def test_loss_is_the_mean_over_answer_tokens():
    tok = ByT5Tokenizer()
    template = PromptTemplate(TemplateConfig())
    torch.manual_seed(0)
    model = build_model(ModelConfig(**TINY_MODEL), tok)
    batch = collate([encode_example(TaskItem("chain_sum", "1 + 2 =", "3"), template, tok)], 0)
    n_prompt = len("Q: 1 + 2 =\nA: ")
    logps = torch.log_softmax(model(input_ids=batch["input_ids"]).logits[0].float(), -1)
    ids = batch["input_ids"][0]
    manual = -torch.stack([logps[t - 1, ids[t]] for t in range(n_prompt, ids.numel())]).mean()
    torch.testing.assert_close(answer_loss(model, batch), manual)


def test_run_sft_saves_a_loadable_checkpoint_and_reports_accuracy(tmp_path):
    cfg = SFTConfig(
        model=ModelConfig(**TINY_MODEL),
        task=TaskMixConfig(**EASY_TASKS),
        sampling=SamplingConfig(max_new_tokens=4),
        sft=SFTLoopConfig(steps=3, batch_size=4, warmup_steps=1, threads=1),
        eval=SFTEvalConfig(prompts_per_task=2, num_generations=2),
        logger=LoggerConfig(progress=False, console=False),
    )
    summary = run_sft(cfg, tmp_path)
    assert set(summary["accuracy"]) == {"chain_sum", "basic_arithmetic"}
    for acc in summary["accuracy"].values():
        assert 0.0 <= acc["sampled_accuracy"] <= 1.0 and 0.0 <= acc["greedy_accuracy"] <= 1.0
    assert json.loads((tmp_path / "sft_eval.json").read_text())["steps"] == 3
    loaded = build_model(ModelConfig(pretrained=str(tmp_path / "model"), tokenizer=str(tmp_path / "model")))
    assert sum(p.numel() for p in loaded.parameters()) == summary["params"]
