"""Every number of a SAPO config finite and in range, checked before any node starts.

One function per section; each raises ValueError `<section>.<field>=<value> must be ...`, which
the recipe prints as one `config error:` line. The sections' own `__post_init__` checks run
first, and most compare with `<` (NaN passes, inf often too): these checks test membership
positively (`core.config_checks.check_range`), so NaN and inf always fail. Upper bounds are far beyond
any sane setting; they exist so that a typo (`1e12` characters, an `inf` TTL) fails here
instead of allocating, overflowing or waiting for ever in a running node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decentrain.core.config_checks import check_range

if TYPE_CHECKING:
    from decentrain.algorithms.sapo.config import SAPOConfig

DAY_S = 86400.0
MAX_COUNT = 1 << 31  # rounds, sizes, seeds: what an int32 index holds
MAX_TOKENS = 1 << 20  # tokens per prompt or completion
MAX_CHARS = 1 << 20  # characters per question or completion on the wire
KEY_BYTES = 32  # a raw Ed25519 private key (identity.NodeIdentity)


def check_model(m, where: str = "model") -> None:
    check_range(f"{where}.hidden_size", m.hidden_size, 1, 1 << 16)
    check_range(f"{where}.num_layers", m.num_layers, 1, 1 << 10)
    check_range(f"{where}.num_heads", m.num_heads, 1, 1 << 10)
    check_range(f"{where}.intermediate_size", m.intermediate_size, 1, 1 << 18)
    check_range(f"{where}.max_seq_len", m.max_seq_len, 1, MAX_TOKENS)
    check_range(f"{where}.rope_theta", m.rope_theta, 0, 1e12, low_open=True)
    check_range(f"{where}.num_kv_heads", m.num_kv_heads, 1, m.num_heads, none_ok=True)
    if m.num_kv_heads is not None and m.num_heads % m.num_kv_heads:
        raise ValueError(f"{where}.num_kv_heads={m.num_kv_heads} must divide {where}.num_heads={m.num_heads}")


def check_task(t, where: str = "task") -> None:
    check_range(f"{where}.size", t.size, 1, MAX_COUNT)
    for i, w in enumerate(t.weights or []):
        check_range(f"{where}.weights[{i}]", w, 0, 1e6)
    for name, kwargs in t.task_kwargs.items():
        check_task_kwargs(name, kwargs, f"{where}.task_kwargs.{name}")


def check_task_kwargs(name: str, kwargs: Any, where: str) -> None:
    """reasoning-gym builds the task's config from these kwargs: build it now (one entry), not in a node."""
    import reasoning_gym

    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"{where}={kwargs!r} must be a mapping of the task's config fields")
    for key, value in kwargs.items():
        if isinstance(value, float):
            check_range(f"{where}.{key}", value)
    try:
        reasoning_gym.create_dataset(name, size=1, seed=0, **kwargs)
    except Exception as e:  # reasoning-gym raises TypeError, ValueError or AssertionError for a bad field
        detail = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        raise ValueError(f"{where}={kwargs!r} is refused by reasoning-gym's {name} config: {detail}") from None


def check_reward(r, where: str = "reward") -> None:
    check_range(f"{where}.format_weight", r.format_weight, 0, 100)


def check_sampling(s, where: str = "sampling") -> None:
    check_range(f"{where}.max_new_tokens", s.max_new_tokens, 1, MAX_TOKENS)
    check_range(f"{where}.temperature", s.temperature, 0, 100)
    check_range(f"{where}.top_p", s.top_p, 0, 1, low_open=True)
    check_range(f"{where}.top_k", s.top_k, 0, MAX_TOKENS, none_ok=True)
    check_range(f"{where}.batch_size", s.batch_size, 1, 1 << 16)


def check_loss(c, where: str = "loss") -> None:
    check_range(f"{where}.num_generations", c.num_generations, 2, 1 << 12)
    check_range(f"{where}.epsilon", c.epsilon, 0, 1)  # a clip below 1 - 1 = 0 would flip the ratio's sign
    check_range(f"{where}.epsilon_high", c.epsilon_high, 0, 100)
    check_range(f"{where}.beta", c.beta, 0, 1e3)
    check_range(f"{where}.num_iterations", c.num_iterations, 1, 1 << 10)
    check_range(f"{where}.max_completion_length", c.max_completion_length, 1, MAX_TOKENS, none_ok=True)
    check_range(f"{where}.spo_rho", c.spo_rho, 0, 1, low_open=True)


def check_batch(b, where: str = "batch") -> None:
    check_range(f"{where}.num_local", b.num_local, 0, 1 << 16)
    check_range(f"{where}.num_external", b.num_external, 0, 1 << 16)


def check_optim(o, where: str = "optim") -> None:
    check_range(f"{where}.lr", o.lr, 0, 10, low_open=True)
    check_range(f"{where}.weight_decay", o.weight_decay, 0, 10)
    for i, beta in enumerate(o.betas):
        check_range(f"{where}.betas[{i}]", beta, 0, 1, high_open=True)
    check_range(f"{where}.grad_clip", o.grad_clip, 0, 1e6)  # 0: off


def check_payload(p, where: str = "payload") -> None:
    check_range(f"{where}.num_generations", p.num_generations, 2, 1 << 12)
    check_range(f"{where}.max_bytes", p.max_bytes, 1, 1 << 30)
    check_range(f"{where}.max_groups", p.max_groups, 1, 1 << 16)
    check_range(f"{where}.max_string_chars", p.max_string_chars, 1, MAX_CHARS)
    check_range(f"{where}.max_dataset_size", p.max_dataset_size, 1, MAX_COUNT)
    check_range(f"{where}.ttl_rounds", p.ttl_rounds, 0, 1 << 20)
    check_range(f"{where}.max_age_s", p.max_age_s, 0, 365 * DAY_S, low_open=True)
    check_range(f"{where}.max_peers_tracked", p.max_peers_tracked, 1, 1 << 24)
    check_range(f"{where}.sender_budget_s", p.sender_budget_s, 0, 3600, low_open=True)
    check_range(f"{where}.mismatch_cost_s", p.mismatch_cost_s, 0, 3600)
    check_range(f"{where}.malformed_cost_s", p.malformed_cost_s, 0, 3600)
    check_range(f"{where}.round_budget_s", p.round_budget_s, 0, 3600, low_open=True)


def check_train(t, where: str = "train") -> None:
    check_range(f"{where}.rounds", t.rounds, 1, MAX_COUNT)
    check_range(f"{where}.questions_per_round", t.questions_per_round, 1, 1 << 16, none_ok=True)
    check_range(f"{where}.candidates_factor", t.candidates_factor, 1, 1 << 10)
    check_range(f"{where}.micro_batch_size", t.micro_batch_size, 1, 1 << 16)
    check_range(f"{where}.max_prompt_tokens", t.max_prompt_tokens, 1, MAX_TOKENS)
    check_range(f"{where}.checkpoint_every", t.checkpoint_every, 0, MAX_COUNT)
    check_range(f"{where}.keep_checkpoints", t.keep_checkpoints, 1, 1 << 16)
    check_range(f"{where}.seed", t.seed, 0, (1 << 32) - 1)
    check_range(f"{where}.threads", t.threads, 1, 1 << 12, none_ok=True)


def check_eval(e, where: str = "eval") -> None:
    check_range(f"{where}.every", e.every, 0, MAX_COUNT)
    check_range(f"{where}.prompts_per_task", e.prompts_per_task, 1, 1 << 20)
    check_range(f"{where}.seed_offset", e.seed_offset, 0, MAX_COUNT)


def check_key_file(path: str | None, node_names: list[str]) -> None:
    """An existing key file must be a readable 32-byte file; a new one must be creatable."""
    if path is None:
        return  # <run_dir>/<node>/node.key, created with the run dir
    for name in node_names:
        p = Path(path.replace("{node}", name))
        if p.exists():
            if not p.is_file():
                raise ValueError(f"key_file={path!r}: {p} is not a regular file")
            try:
                size = len(p.read_bytes())
            except OSError as e:
                raise ValueError(f"key_file={path!r}: {p} cannot be read ({e.strerror})") from None
            if size != KEY_BYTES:
                raise ValueError(
                    f"key_file={path!r}: {p} holds {size} bytes, expected {KEY_BYTES} (a raw Ed25519 private key)"
                )
            continue
        parent = next(a for a in p.parents if a.exists())  # the nearest ancestor that exists ("/" does)
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"key_file={path!r}: {p} cannot be created ({parent} is not a writable directory)")


SECTION_CHECKS = {
    "model": check_model,
    "task": check_task,
    "reward": check_reward,
    "sampling": check_sampling,
    "loss": check_loss,
    "batch": check_batch,
    "optim": check_optim,
    "payload": check_payload,
    "train": check_train,
    "eval": check_eval,
}


def check_sapo_values(cfg: SAPOConfig) -> None:
    """Every section's numbers, then the key file (the exchange section checks its own:
    exchange/hivemind_config.check_hivemind_config)."""
    for section, check in SECTION_CHECKS.items():
        check(getattr(cfg, section))
    count = cfg.num_nodes if cfg.node_index is None else 1
    first = cfg.node_index or 0
    names = [cfg.node_id] if cfg.node_id else [f"node{i}" for i in range(first, first + count)]
    check_key_file(cfg.key_file, names)
