"""The scale of a pre-training comparison: the model sizes it trains, the steps that read a number of tokens
per parameter, and the corpus, taken from the training recipe's own Hydra config (`--data`, `--override`).
Re-exported from benchmarks/harness.py, where scripts import it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.record import ROOT


def add_corpus_flags(ap: argparse.ArgumentParser, data: str = "offline") -> None:
    """`--data NAME` (a Hydra data option: offline, pinned, ...) and `--override KEY=VALUE ...`: Hydra overrides
    passed through to the training recipe's config (`conf/config.yaml`), from which the run takes its data."""
    ap.add_argument("--data", default=data, help="the Hydra data option every run trains on (data=<this>)")
    ap.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="more Hydra overrides of the training config, e.g. data.max_bytes_per_domain=100000",
    )


def recipe_sections(overrides: Sequence[str], sections: Sequence[str] = ("data",)) -> dict[str, Any]:
    """The named sections of the training recipe's config composed with `overrides`, resolved to plain dicts
    (composed once per benchmark: the runs then carry them, so the cache key follows the data they train on)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from decentrain.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, "run_dir=unused"])
    return {k: OmegaConf.to_container(cfg[k], resolve=True) for k in sections}


# Llama sizes (byte vocabulary) the pre-training comparisons train; `--model` picks one
MODEL_SIZES = {
    "xs": {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 88},
    "s": {"hidden": 48, "layers": 2, "heads": 2, "intermediate": 128},
    "m": {"hidden": 64, "layers": 2, "heads": 2, "intermediate": 176},
}


def model_section(model: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """A MODEL_SIZES entry as the training config's `model` section."""
    return {
        "hidden_size": model["hidden"],
        "num_layers": model["layers"],
        "num_heads": model["heads"],
        "intermediate_size": model["intermediate"],
        "max_seq_len": seq_len,
    }


def model_params(model: dict[str, Any], seq_len: int) -> int:
    """Parameters of a MODEL_SIZES entry (embeddings included: tokens per parameter count them)."""
    from decentrain.config import config_from_dict
    from decentrain.models.factory import build_model, build_tokenizer, num_params

    cfg = config_from_dict({"model": model_section(model, seq_len)})
    return num_params(build_model(cfg.model, build_tokenizer(cfg.model)))


def steps_for(params: int, tokens_per_step: int, tokens_per_param: float, multiple: int) -> int:
    """The fewest steps (a multiple of `multiple`) that read `tokens_per_param` tokens per parameter."""
    return max(multiple, math.ceil(tokens_per_param * params / tokens_per_step / multiple) * multiple)


def corpus_facts(data: dict[str, Any], model: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """The corpus every run of a benchmark trains on: its identity ({name, hash, note}: the pinned corpus's hash,
    or why there is none) and its training tokens (for epochs). Built once, in the benchmark's own process."""
    from decentrain.config import config_from_dict
    from decentrain.data.blocks import build_corpus
    from decentrain.models.factory import build_tokenizer

    cfg = config_from_dict({"data": {**data, "seq_len": seq_len}, "model": model_section(model, seq_len)})
    corpus = build_corpus(cfg.data, build_tokenizer(cfg.model))
    return {**corpus.identity, "train_tokens": sum(len(corpus.blocks[d]["train"]) for d in corpus.blocks) * seq_len}


def corpus_of(rows: Iterable[dict]) -> dict[str, Any] | None:
    """The corpus a run's metrics name (the header record's {"name", "hash"}); None when not logged."""
    from decentrain.core.metrics import corpus_header

    c = corpus_header(rows)
    return None if c is None else {"name": c.get("name"), "hash": c.get("hash")}


def divergence(error: BaseException) -> str | None:
    """The training loop's own stop on a non-finite loss or weights (FloatingPointError, wrapped by the in-process
    replicas), as text; None for any other failure, which the benchmark must not swallow. A grid point that
    diverges is a result (it loses), not a crash of the whole search."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, FloatingPointError):
            return str(seen)
        seen = seen.__cause__
    return None
