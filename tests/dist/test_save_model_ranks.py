"""Every rank that saves its own model gets a loadable directory. transformers 5 writes the weights
and config only on torch.distributed's rank 0: the other nodes of `python -m recipes.dei` (each
trains its own operator) saved the tokenizer alone and died loading it ("Unrecognized model")."""

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = [pytest.mark.dist]


def _save_and_load(world, root):
    from pathlib import Path

    from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model

    cfg = ModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_seq_len=32)
    tok = build_tokenizer(cfg)
    torch.manual_seed(world.rank)  # each rank's own model
    model = build_model(cfg, tok)
    out = save_model(model, tok, Path(root) / f"rank{world.rank}")
    loaded = build_model(ModelConfig(pretrained=str(out)), tok)
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    return sorted(p.name for p in out.iterdir() if p.suffix in (".json", ".safetensors")), same


def test_each_rank_saves_and_reloads_its_own_model(tmp_path):
    for files, same in run_ranks(_save_and_load, 2, str(tmp_path)):
        assert "config.json" in files and "model.safetensors" in files and same
