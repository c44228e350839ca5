"""`save_pretrained` of a model on whichever rank calls it, without accelerate's DeepSpeed probe."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from transformers import PreTrainedModel


@contextlib.contextmanager
def _no_deepspeed_probe():
    """save_pretrained unwraps the model through accelerate, which imports DeepSpeed when it is installed
    (seconds, and its "Setting accelerator to CPU" warning on every run) only to test isinstance against
    DeepSpeedEngine. The model handed here is a plain transformers module: unless DeepSpeed is already in
    use (its engine imported it), tell accelerate it is absent for this call."""
    other = sys.modules.get("accelerate.utils.other")
    if other is None:
        try:
            import accelerate.utils.other as other
        except ImportError:  # no accelerate: transformers unwraps by itself, without DeepSpeed
            other = None
    if other is None or "deepspeed" in sys.modules or not hasattr(other, "is_deepspeed_available"):
        yield
        return
    probe = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = probe


def save_weights(model: PreTrainedModel, out_dir: str | Path) -> None:
    """`model.save_pretrained(out_dir)` (safetensors, config) on whichever rank calls it.

    transformers 5 writes the files only on torch.distributed's rank 0, whatever `is_main_process`
    says (`should_save_on_this_rank`). Here each caller saves a model of its own (a DEI node's
    operator, an HDEE expert, a SAPO node's weights for vLLM): on every other rank the directory
    got the tokenizer alone, and loading it failed ("Unrecognized model ... model_type")."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process  # the caller decides who saves
    try:
        with _no_deepspeed_probe():
            model.save_pretrained(out_dir, safe_serialization=True)
    finally:
        del model.should_save_on_this_rank
