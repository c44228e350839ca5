"""A node's training batch: I local and J external question groups, re-scored and re-tokenised here.

Each group is an `Arrival`: one group as it reached this node, owned by the identity that signed
the payload it came in (or by this node), never by its content. J slots are shared fairly among
senders (`fair_quota`), so one sender offering many usable groups cannot crowd out the others.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from decentrain.algorithms.sapo.payload import RolloutGroup

EXTERNAL_SAMPLING = ("uniform", "reward_weighted")


@dataclass(frozen=True, eq=False)
class Arrival:
    """One group as this node received it (eq=False: two arrivals of equal groups stay two records).

    `sender` is the identity that signed the payload it came in, None for this node's own group:
    work on the group is charged to it, and only its own data can make the group unscorable.
    `item` is the entry this node built or rebuilt for it (what the verifier scores against);
    `rewards`, once scored, this node's rewards of its completions. `sender_logprobs`: per
    completion, the sender's sampling log-probs of its tokens as cut here, in this node's tokenizer
    (checked by the node; None where not sent, not checkable or dropped): `loss.external_is`.
    """

    group: RolloutGroup
    sender: str | None = None
    item: Any = None
    rewards: tuple[float, ...] | None = None
    sender_logprobs: tuple[tuple[float, ...] | None, ...] | None = None


# The receiver's verifier: one reward per completion of a group. It may raise ValueError for an
# external group it cannot score (a task it does not know, a sender over budget); such groups are
# dropped and counted. It must not raise for this node's own groups.
RewardFn = Callable[[Arrival], Sequence[float]]


@dataclass
class SwarmBatchConfig:
    num_local: int = 4  # I: question groups from this node
    num_external: int = 4  # J: question groups drawn from peers
    external_sampling: str = "uniform"

    def __post_init__(self) -> None:
        if self.num_local < 0 or self.num_external < 0:
            raise ValueError(f"num_local={self.num_local} and num_external={self.num_external} must be >= 0")
        if self.num_local + self.num_external == 0:
            raise ValueError("num_local + num_external (I+J) must be > 0")
        if self.external_sampling not in EXTERNAL_SAMPLING:
            raise ValueError(
                f"external_sampling={self.external_sampling!r} is unknown; allowed: {list(EXTERNAL_SAMPLING)}"
            )


@dataclass
class ScoredGroup:
    group: RolloutGroup
    rewards: list[float]
    external: bool
    sender: str | None = None
    sender_logprobs: tuple[tuple[float, ...] | None, ...] | None = None


@dataclass
class SwarmBatch:
    groups: list[ScoredGroup]
    num_local: int
    num_external: int
    stats: dict[str, int] = field(default_factory=dict)  # external candidates and why they were dropped


def fair_quota(k: int, offered: Sequence[int]) -> int:
    """The fewest slots per sender that fill `k` slots from senders offering `offered` groups each.

    ceil(k / senders) when every sender offers that many; more only when others cannot fill
    their share (max-min fairness: J=4, senders offering 1 and 10 groups -> 3).
    """
    q = math.ceil(k / len(offered))
    while sum(min(q, n) for n in offered) < k:
        q += 1
    return q


def draw_external(
    usable: Sequence[ScoredGroup], k: int, weights: np.ndarray | None, rng: np.random.Generator
) -> list[ScoredGroup]:
    """`k` of `usable` without replacement, with probability proportional to `weights` (None:
    uniform) among the groups whose sender has not yet taken its `fair_quota` of slots."""
    quota = fair_quota(k, list(Counter(s.sender for s in usable).values()))
    w = np.ones(len(usable)) if weights is None else np.asarray(weights, dtype=np.float64).copy()
    taken: Counter = Counter()
    picked: list[ScoredGroup] = []
    for _ in range(k):
        i = int(rng.choice(len(usable), p=w / w.sum()))
        picked.append(usable[i])
        w[i] = 0.0
        taken[usable[i].sender] += 1
        if taken[usable[i].sender] >= quota:
            w[[j for j, s in enumerate(usable) if s.sender == usable[i].sender]] = 0.0
    return picked


def build_swarm_batch(
    local: Sequence[Arrival],
    external: Sequence[Arrival],
    reward_fn: RewardFn,
    cfg: SwarmBatchConfig,
    rng: np.random.Generator,
) -> SwarmBatch:
    """Take the first I local groups; draw J external groups among those with non-equal rewards.

    All-equal external groups carry zero group advantage, so they are dropped before the draw.
    With fewer than J usable external groups, all of them are used (`num_external` says how many).
    No sender takes more than its fair share of the J slots (`draw_external`).
    """
    groups = [ScoredGroup(a.group, [float(r) for r in reward_fn(a)], False, a.sender) for a in local[: cfg.num_local]]

    usable: list[ScoredGroup] = []
    stats = {"external_candidates": len(external), "external_unscorable": 0, "external_equal_rewards": 0}
    for a in external if cfg.num_external else ():
        try:
            rewards = [float(r) for r in reward_fn(a)]
        except ValueError:
            stats["external_unscorable"] += 1
            continue
        if max(rewards) == min(rewards):
            stats["external_equal_rewards"] += 1
            continue
        usable.append(ScoredGroup(a.group, rewards, True, a.sender, a.sender_logprobs))

    k = min(cfg.num_external, len(usable))
    if k:
        w = None
        if cfg.external_sampling == "reward_weighted":
            # Mean reward, floored so that groups with non-positive mean can still be drawn.
            w = np.array([max(float(np.mean(s.rewards)), 0.0) for s in usable]) + 1e-6
        groups += draw_external(usable, k, w, rng)
    return SwarmBatch(groups=groups, num_local=len(groups) - k, num_external=k, stats=stats)


@dataclass
class TokenizedBatch:
    """Prompts left-padded and completions right-padded, so [prompt | completion] is contiguous."""

    prompt_ids: Tensor  # [N, P], N = groups * G
    prompt_mask: Tensor
    completion_ids: Tensor  # [N, C]
    completion_mask: Tensor
    rewards: Tensor  # [groups, G]
    prompts: list[str]  # one per group: the receiver's prompt text (SPO tracker key)
    # [N, C] senders' sampling log-probs, with a mask of 1 where one is known; None: none known
    sender_logps: Tensor | None = None
    sender_mask: Tensor | None = None


def pad_sequences(seqs: list[list[int]], pad_id: int, left: bool) -> tuple[Tensor, Tensor]:
    """Stack ragged id lists into (ids, mask) [N, max_len], padded on the left or the right."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), max(width, 1)), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        if s:
            sl = slice(ids.size(1) - len(s), None) if left else slice(0, len(s))
            ids[i, sl] = torch.tensor(s, dtype=torch.long)
            mask[i, sl] = 1
    return ids, mask


def tokenize_batch(
    groups: Sequence[ScoredGroup],
    tokenizer: Any,
    template: Callable[[str], str],
    max_prompt_tokens: int,
    max_completion_tokens: int,
) -> TokenizedBatch:
    """Re-tokenise text with this node's template and tokenizer (peers may use different ones).

    Prompts keep their last `max_prompt_tokens` tokens (the question's end and the answer cue).
    Completions were already cut to `max_completion_tokens` by the node before they were scored
    (`generation.clip_to_tokens`), so the cut here changes nothing: the trained text is the scored text.
    """
    prompts = [template(s.group.question) for s in groups]

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt_seqs, completion_seqs, sender_seqs = [], [], []
    for prompt, s in zip(prompts, groups):
        p = encode(prompt)[-max_prompt_tokens:]
        sender = s.sender_logprobs or (None,) * len(s.group.completions)
        for c, lp in zip(s.group.completions, sender, strict=True):
            prompt_seqs.append(p)
            completion_seqs.append(encode(c)[:max_completion_tokens])
            # the node aligned them to these very tokens; anything else is not used
            sender_seqs.append(lp if lp is not None and len(lp) == len(completion_seqs[-1]) else None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompt_ids, prompt_mask = pad_sequences(prompt_seqs, pad_id, left=True)
    completion_ids, completion_mask = pad_sequences(completion_seqs, pad_id, left=False)
    rewards = torch.tensor([s.rewards for s in groups], dtype=torch.float32)
    tb = TokenizedBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, rewards, prompts)
    if any(lp is not None for lp in sender_seqs):
        tb.sender_logps = torch.zeros(completion_ids.shape, dtype=torch.float32)
        tb.sender_mask = torch.zeros_like(completion_mask)
        for i, lp in enumerate(sender_seqs):
            if lp:
                tb.sender_logps[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
                tb.sender_mask[i, : len(lp)] = 1
    return tb
