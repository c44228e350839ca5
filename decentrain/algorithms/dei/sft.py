"""Train a small causal LM to write Redcode: the CPU-scale mutation operators of a DEI swarm.

The corpus is the shipped warriors in their canonical rendering plus variants made from them by
random edits (a number, a mode, a modifier or an opcode changed; a line dropped or repeated),
kept only when they still parse: a model trained on it writes text that parses often enough to
search with, and varies it. Nothing here is a peer's text.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from decentrain.algorithms.dei.redcode import MODES, MODIFIERS, OPCODES, Instruction, RedcodeLimits, Warrior, parse
from decentrain.models.factory import ModelConfig, build_model, build_tokenizer, save_model

log = logging.getLogger(__name__)


@dataclass
class OperatorSFTConfig:
    steps: int = 200
    batch_size: int = 16
    lr: float = 2e-3
    variants: int = 400  # edited copies of the shipped warriors in the corpus
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "variants"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"sft.{name}={getattr(self, name)!r} must be an integer >= 1")
        if not 0 < self.lr < 1:
            raise ValueError(f"sft.lr={self.lr} must be in (0, 1)")


def shipped_warriors(limits: RedcodeLimits = RedcodeLimits()) -> dict[str, Warrior]:
    folder = resources.files("decentrain.algorithms.dei") / "warriors"
    out = {}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".red"):
            out[entry.name[:-4]] = parse(entry.read_text(), limits).warrior
    return out


def _edit(w: Warrior, rng: np.random.Generator, core: int) -> Warrior:
    ins = list(w.instructions)
    i = int(rng.integers(len(ins)))
    old = ins[i]
    kind = int(rng.integers(6))
    if kind == 0:
        new = Instruction(old.opcode, old.modifier, old.a_mode, int(rng.integers(core)), old.b_mode, old.b)
    elif kind == 1:
        new = Instruction(old.opcode, old.modifier, old.a_mode, old.a, old.b_mode, int(rng.integers(core)))
    elif kind == 2:
        new = Instruction(old.opcode, old.modifier, str(rng.choice(list(MODES))), old.a, old.b_mode, old.b)
    elif kind == 3:
        new = Instruction(old.opcode, str(rng.choice(MODIFIERS)), old.a_mode, old.a, old.b_mode, old.b)
    elif kind == 4:
        new = Instruction(str(rng.choice(OPCODES[:-1])), old.modifier, old.a_mode, old.a, old.b_mode, old.b)
    else:
        ins.insert(i, old)  # a repeated line
        return Warrior(tuple(ins[:100]), w.start)
    ins[i] = new
    return Warrior(tuple(ins), w.start % len(ins))


def corpus(n_variants: int, seed: int, limits: RedcodeLimits = RedcodeLimits()) -> list[str]:
    base = list(shipped_warriors(limits).values())
    rng = np.random.default_rng(seed)
    texts = [w.render() for w in base]
    while len(texts) < len(base) + n_variants:
        w = base[int(rng.integers(len(base)))]
        for _ in range(int(rng.integers(1, 4))):
            w = _edit(w, rng, limits.core_size)
        text = w.render()
        if parse(text, limits).warrior is not None:
            texts.append(text)
    return texts


def train_operator(cfg: OperatorSFTConfig, out_dir: Path) -> Path:
    """Train `cfg.model` on the corpus for `cfg.steps` steps and save it to `out_dir`."""
    torch.manual_seed(cfg.seed)
    tokenizer = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tokenizer)
    texts = corpus(cfg.variants, cfg.seed)
    rows = [tokenizer(t, add_special_tokens=True).input_ids[: cfg.model.max_seq_len] for t in texts]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = np.random.default_rng(cfg.seed)
    pad = tokenizer.pad_token_id
    t0 = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        batch = [rows[int(i)] for i in rng.integers(len(rows), size=cfg.batch_size)]
        width = max(len(r) for r in batch)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in batch])
        labels = ids.masked_fill(ids == pad, -100)
        loss = model(input_ids=ids, attention_mask=(ids != pad).long(), labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:  # linear decay to 10 %
            g["lr"] = cfg.lr * (1 - 0.9 * step / cfg.steps)
        opt.step()
        if step % 50 == 0 or step == cfg.steps - 1:
            log.info(
                "operator sft step %d/%d loss %.3f (%.0f s)", step + 1, cfg.steps, loss.item(), time.perf_counter() - t0
            )
    return save_model(model, tokenizer, out_dir)
