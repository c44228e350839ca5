"""LoRA adapters through `peft` (the field's library for them), so a node can train a 135M model on 2 cores.

`model.lora_rank > 0` wraps the built model in a `peft` LoRA model: the base weights are frozen and
only the adapters train (a fraction of a percent of the parameters: fewer gradients, a smaller
optimizer state, a smaller checkpoint step). Saving merges the adapters into a copy of the base
weights, so a saved model loads as a plain transformers model with `model.pretrained=<dir>`.
"""

from __future__ import annotations

import copy
from typing import Any

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def apply_lora(model: Any, rank: int, alpha: float, dropout: float, targets: list[str]) -> Any:
    """`model` with LoRA adapters of `rank` on the linear layers named in `targets`; the rest frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("model.lora_rank > 0 needs the peft package: pip install 'decentrain[smollm2]'") from None
    cfg = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none", task_type="CAUSAL_LM"
    )
    return get_peft_model(model, cfg)


def is_lora(model: Any) -> bool:
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


def merged_copy(model: Any) -> Any:
    """A plain transformers model with the adapters folded in (the trained model is left as it is)."""
    return copy.deepcopy(model).merge_and_unload() if is_lora(model) else model


def trainable_parameters(model: Any) -> list:
    """What the optimizer steps: every parameter of a full model, the adapters of a LoRA one."""
    return [p for p in model.parameters() if p.requires_grad]
