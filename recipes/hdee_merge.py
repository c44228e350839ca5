"""Merge a trained HDEE ensemble's experts into one routed model (DUME's closed-form ridge router).

    python -m recipes.hdee_merge ensemble_dir=runs/hdee/homogeneous
    python -m recipes.hdee_merge ensemble_dir=runs/hdee/homogeneous pooling=token ridge_lambda=10

The router is fit on `calibration_blocks` validation blocks per expert domain; the experts stay
frozen. The model is saved with save_pretrained (safetensors) to out_dir and loads with
`RoutedExpertsForCausalLM.from_pretrained(out_dir)`. With score=true the recipe prints the test
log-perplexity per domain of the routed model beside each expert's, and the experts it ran per
sequence.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.hdee.checkpoints import CheckpointError
from decentrain.algorithms.hdee.merge import MergeConfig, build_routed, check_merge, from_ensemble, save_routed
from decentrain.core.comm.ensemble import token_logprobs
from decentrain.data.blocks import build_corpus
from recipes import config_errors, recipe, run, typed_config


def score(model, tokenizer, cfg: MergeConfig) -> dict:
    """Test log-perplexity per expert domain: the routed model, each expert alone, and experts run per sequence."""
    domains = [d for e in cfg.experts for d in e.domains]
    corpus = build_corpus(dataclasses.replace(cfg.data, domains=domains), tokenizer)
    out = {}
    with torch.no_grad():
        for d in domains:
            blocks = corpus.split("test", d)[:64]
            row = {
                "routed": -token_logprobs(model, blocks).double().mean().item(),
                "experts_run_per_sequence": model.experts_run(blocks).mean().item(),
            }
            for name, expert in zip(model.config.expert_names, model.experts):
                row[name] = -token_logprobs(expert, blocks).double().mean().item()
            out[d] = row
    return out


def to_config(dcfg: DictConfig) -> tuple[MergeConfig, bool]:
    """The recipe's one conversion: (MergeConfig, whether to score after saving)."""
    raw = OmegaConf.to_container(dcfg, resolve=True)
    do_score = raw.pop("score", True)
    return typed_config(raw, MergeConfig), do_score


@recipe("hdee_merge")
def main(dcfg: DictConfig) -> None:
    with config_errors():  # the one conversion, and every check that reads no weights, before any model is loaded
        cfg, do_score = to_config(dcfg)
        cfg = from_ensemble(cfg)
        if not cfg.out_dir:
            raise ValueError("out_dir is unset (and no ensemble_dir to put it under)")
        tokenizer = check_merge(cfg)  # sources, sizes, vocabularies, tokenizers, router_layer
    torch.manual_seed(0)
    try:
        model, tokenizer = build_routed(cfg, tokenizer)
    except CheckpointError as e:  # a model not whole or not finite: nothing is saved
        sys.exit(f"checkpoint refused: {e}")
    out = save_routed(model, tokenizer, cfg.out_dir)
    print(
        f"[hdee] routed model: experts {model.config.expert_names}, router {tuple(model.router_weight.shape)}, "
        f"saved to {out}",
        flush=True,
    )
    if do_score:
        res = score(model, tokenizer, cfg)
        (out / "score_test.json").write_text(json.dumps(res, indent=1))
        for d, row in res.items():
            print(f"  {d:<16} " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    run(main)
