"""One SAPO node: its own model, tokenizer, template, verifier and task mix, and one round of

    sample questions -> generate G completions each -> publish / fetch -> I local + J external
    groups -> re-tokenise and re-score here -> `num_iterations` clipped-ratio steps.

What a node takes from its peers (decode, dedupe, budget, clip, rebuild, align, score) is its
`Inbox` (inbox.py): peer records in, scored arrivals out, nothing a peer sends raising out of
`run_round`. Completions, own and peers', are cut at the stop string and at this node's
`max_new_tokens` before they are scored, and that cut text is what is trained. Payloads are signed
with this node's Ed25519 key; with `loss.external_is` they carry its sampling log-probs and
tokenizer fingerprint.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from decentrain.algorithms.sapo.batching import Arrival, build_swarm_batch, tokenize_batch
from decentrain.algorithms.sapo.config import SAPOConfig
from decentrain.algorithms.sapo.evaluation import greedy_accuracy
from decentrain.algorithms.sapo.exchange import RolloutExchange
from decentrain.algorithms.sapo.generation import build_generation_backend, completion_logprobs
from decentrain.algorithms.sapo.grpo import (
    LossNorm,
    build_advantage_estimator,
    filter_off_policy_negatives,
    policy_loss,
    truncated_is_weight,
)
from decentrain.algorithms.sapo.inbox import Inbox
from decentrain.algorithms.sapo.offpolicy import tokenizer_fingerprint
from decentrain.algorithms.sapo.payload import RolloutGroup, RolloutPayload, encode_payload
from decentrain.algorithms.sapo.prompts import build_template
from decentrain.core.identity import NodeIdentity
from decentrain.models.factory import build_model, build_tokenizer, save_model
from decentrain.models.lora import trainable_parameters
from decentrain.tasks import TaskItem, TaskMixture, Verifier

logger = logging.getLogger(__name__)


def group_of(item: TaskItem, completions: tuple[str, ...], logprobs: tuple | None = None) -> RolloutGroup:
    """The wire form of a local group: the entry's address and question, never its answer."""
    ref = item.ref
    if ref is None:
        raise ValueError("only items built by a TaskMixture can be shared")
    return RolloutGroup(ref.task, ref.config, ref.seed, ref.size, ref.index, item.question, completions, logprobs)


def _trim_padding(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Drop the all-padding columns left after removing rows: prompts' left, completions' right."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = tensors
    if prompt_ids.size(0) == 0:
        return tensors
    p = max(int(prompt_mask.sum(1).max()), 1)
    c = max(int(completion_mask.sum(1).max()), 1)
    return [prompt_ids[:, -p:], prompt_mask[:, -p:], completion_ids[:, :c], completion_mask[:, :c]]


class SAPONode:
    def __init__(
        self,
        cfg: SAPOConfig,
        node_index: int,
        node_id: str,
        exchange: RolloutExchange,
        device: torch.device | None = None,
        identity: NodeIdentity | None = None,
    ):
        # node_id: this node's name (logs, run dirs); identity.node_id: its public key (the wire id).
        self.cfg, self.node_index, self.node_id, self.exchange = cfg, node_index, node_id, exchange
        self.identity = identity or NodeIdentity.generate()
        self.device = device or torch.device("cpu")
        self.seed = cfg.train.seed + 1000 * node_index
        torch.manual_seed(self.seed)
        self.tokenizer = build_tokenizer(cfg.model)
        self.model = build_model(cfg.model, self.tokenizer).to(self.device)
        self.model.train()
        # beta > 0: KL to the starting policy, kept frozen.
        self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.loss.beta > 0 else None
        self.optimizer = torch.optim.AdamW(  # a LoRA model steps its adapters only
            trainable_parameters(self.model),
            lr=cfg.optim.lr,
            weight_decay=cfg.optim.weight_decay,
            betas=tuple(cfg.optim.betas),
        )
        self.template = build_template(cfg.template, self.tokenizer)  # plain text, or the tokenizer's chat template
        self.verifier = Verifier(self.template, cfg.reward)
        self.mixture = TaskMixture(cfg.task)
        self.backend = build_generation_backend(self.model, self.tokenizer, self.template.sampling(cfg.sampling))
        # bf16 matmuls in the policy step on CUDA (fp32 master weights and optimizer state): train.precision
        self.autocast = cfg.train.precision == "bf16_autocast" or (
            cfg.train.precision == "auto" and self.device.type == "cuda"
        )
        self.advantage = build_advantage_estimator(cfg.loss)
        self.tokenizer_id = tokenizer_fingerprint(self.tokenizer)
        self.inbox = Inbox(
            cfg.payload,
            cfg.swarm_key,
            self.identity.node_id,
            verifier=self.verifier,
            mixture=self.mixture,
            template=self.template,
            tokenizer=self.tokenizer,
            tokenizer_id=self.tokenizer_id,
            max_new_tokens=cfg.sampling.max_new_tokens,
            external_is=cfg.loss.external_is,
            score=cfg.batch.num_external > 0,
            name=node_id,
        )
        # the inbox's state, under the names the metrics, tests and benchmarks read
        self.decoder, self.budget = self.inbox.decoder, self.inbox.budget
        self.group_drops, self.logprob_drops = self.inbox.group_drops, self.inbox.logprob_drops
        self._local: list[Arrival] = []  # this round's own groups, as scored and trained here
        self.rng = np.random.default_rng(self.seed)
        self.round = 0  # rounds completed
        self.cumulative_reward = 0.0

    @property
    def questions_per_round(self) -> int:
        return self.cfg.train.questions_per_round or max(self.cfg.batch.num_local, 1)

    def rewards(self, arrival: Arrival) -> list[float]:
        """This node's rewards of a group it generated or received (`Inbox.rewards`)."""
        return self.inbox.rewards(arrival)

    # -- the round -------------------------------------------------------------------------------

    def generate(self, round_: int) -> list[RolloutGroup]:
        n = self.questions_per_round
        if self.cfg.train.prioritized_sampling:
            pool = self.mixture.sample(n * self.cfg.train.candidates_factor, self.rng)
            p = self.advantage.sampling_weights([self.template(it.question) for it in pool])
            items = [pool[int(i)] for i in self.rng.choice(len(pool), size=n, replace=False, p=p)]
        else:
            items = self.mixture.sample(n, self.rng)
        prompts, g = [self.template(it.question) for it in items], self.cfg.loss.num_generations
        seed = self.seed * 100_003 + round_
        if self.cfg.loss.external_is:  # peers correct against what this node sampled with
            completions, logprobs = self.backend.generate_scored(prompts, g, seed=seed)
        else:
            completions, logprobs = self.backend.generate(prompts, g, seed=seed), [None] * len(items)
        groups = [
            group_of(it, tuple(c), None if lp is None else tuple(lp)) for it, c, lp in zip(items, completions, logprobs)
        ]
        self._local = [Arrival(self.inbox.clip(g), None, it) for g, it in zip(groups, items)]
        return groups

    def share(self, round_: int, local: list[RolloutGroup]) -> list[Arrival]:
        """Publish `local`; return the peers' groups that rebuild (and score) here, each owned by its signer."""
        payload = RolloutPayload(
            self.identity.node_id,
            round_,
            time.time(),
            tuple(local),
            name=self.node_id,
            tokenizer=self.tokenizer_id if self.cfg.loss.external_is else None,
        )
        wire = encode_payload(payload, self.identity, self.cfg.swarm_key)
        peek = self.inbox.peek(round_)  # the exchange counts only records that pass, and those that end its wait
        records = self.exchange.exchange(round_, wire, is_valid=peek.is_valid, ends_wait=peek.ends_wait)
        return self.inbox.receive(records, peek, own=self._local)

    def train_step(self, batch_groups) -> dict[str, float]:
        cfg = self.cfg
        tb = tokenize_batch(
            batch_groups, self.tokenizer, self.template, cfg.train.max_prompt_tokens, cfg.sampling.max_new_tokens
        )
        tensors = [t.to(self.device) for t in (tb.prompt_ids, tb.prompt_mask, tb.completion_ids, tb.completion_mask)]
        advantages = self.advantage(tb.prompts, tb.rewards).reshape(-1).to(self.device)
        mb = cfg.train.micro_batch_size
        temperature = cfg.sampling.temperature or 1.0
        norm = LossNorm.from_mask(tb.completion_mask, mb)
        # peers' sampling log-probs and where they are known ([N, C] each), for `loss.external_is`
        sender = (
            None
            if not cfg.loss.external_is or tb.sender_logps is None
            else [tb.sender_logps.to(self.device), tb.sender_mask.to(self.device)]
        )
        if cfg.loss.beta == 0 and cfg.loss.loss_type != "bnpo":
            # A completion with zero advantage adds nothing to the gradient when there is no KL term,
            # so it is skipped; `norm` still counts it, so the loss equals the full batch's.
            keep = advantages != 0
            tensors, advantages = _trim_padding([t[keep] for t in tensors]), advantages[keep]
            if sender is not None:
                sender = [t[keep][:, : tensors[2].size(1)] for t in sender]
        old_logps = ref_logps = None
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):  # as the loss's pass
            if cfg.loss.num_iterations > 1:  # the ratio is 1 on the first pass otherwise
                old_logps = completion_logprobs(self.model, *tensors, mb, temperature)
            if self.ref_model is not None:
                ref_logps = completion_logprobs(self.ref_model, *tensors, mb, temperature)
        n = tensors[0].size(0)
        totals = {"loss": 0.0, "clip_ratio": 0.0, "grad_norm": 0.0, "trained_completions": float(n)}
        if n == 0:
            return totals
        # summed on the device and read once at the end: a host read per micro-batch would stall the GPU
        loss_sum = torch.zeros((), device=self.device)
        clip_sum = torch.zeros((), device=self.device)
        grad_sum = torch.zeros((), device=self.device)
        weights: list[torch.Tensor] = []  # the IS weights of peers' tokens, first pass (they do not change)
        kept: list[torch.Tensor] = []  # F-TIS: per micro-batch, 1 for the completions kept (decided on the first pass)
        for it in range(cfg.loss.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for k, i in enumerate(range(0, n, mb)):
                sl = slice(i, i + mb)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast):
                    logps = completion_logprobs(self.model, *(t[sl] for t in tensors), mb, temperature)
                is_weights, adv = None, advantages[sl]
                if sender is not None:  # pi_old: this node's policy before the step, as the ratio's
                    old = logps.detach() if old_logps is None else old_logps[sl]
                    is_weights = truncated_is_weight(old, sender[0][sl], sender[1][sl], cfg.loss.external_is_cap)
                    if it == 0:
                        weights.append(is_weights[sender[1][sl].bool()])
                    if cfg.loss.ftis_kl is not None:  # a dropped completion weighs as one with zero advantage
                        if it == 0:
                            kept.append(
                                filter_off_policy_negatives(old, sender[0][sl], sender[1][sl], adv, cfg.loss.ftis_kl)
                            )
                        adv = adv * kept[k]
                loss, stats = policy_loss(
                    logps,
                    adv,
                    tensors[3][sl],
                    cfg.loss,
                    norm,
                    old_logps=None if old_logps is None else old_logps[sl],
                    ref_logps=None if ref_logps is None else ref_logps[sl],
                    is_weights=is_weights,
                )
                loss.backward()
                loss_sum += loss.detach().float()
                clip_sum += stats["clip_ratio"].float() / norm.num_micro_batches
            if cfg.optim.grad_clip > 0:
                grad_sum += torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip).float()
            self.optimizer.step()
        totals["loss"], totals["clip_ratio"], totals["grad_norm"] = torch.stack([loss_sum, clip_sum, grad_sum]).tolist()
        iters = cfg.loss.num_iterations
        out = {k: v if k == "trained_completions" else v / iters for k, v in totals.items()}
        if kept:
            out["ftis_dropped"] = float((torch.cat(kept) == 0).sum().item())
        if weights and (w := torch.cat(weights)).numel():
            out.update(
                is_tokens=float(w.numel()),
                is_weight_mean=w.mean().item(),
                is_weight_min=w.min().item(),
                is_weight_max=w.max().item(),
                is_capped=(w >= cfg.loss.external_is_cap).float().mean().item(),
            )
        return out

    def run_round(self) -> dict[str, Any]:
        """One full round; returns its metrics."""
        round_ = self.round
        self._local = []
        self.inbox.start_round()
        t0 = time.perf_counter()
        local = self.generate(round_)
        t1 = time.perf_counter()
        external = self.share(round_, local)
        t2 = time.perf_counter()
        batch = build_swarm_batch(self._local, external, self.rewards, self.cfg.batch, self.rng)
        self.inbox.credit(batch.groups)
        # Reward of this node's own rollouts: comparable across I/J splits (external ones are peers').
        own_rewards = [r for a in self._local for r in self.rewards(a)]
        reward = float(np.mean(own_rewards)) if own_rewards else 0.0
        train = self.train_step(batch.groups) if batch.groups else {}
        t3 = time.perf_counter()
        self.round += 1
        self.cumulative_reward += reward
        # genrl's `train/rewards`: the mean over the training batch, external groups included (these
        # rise mechanically: a kept external group holds at least one correct answer).
        batch_rewards = [r for s in batch.groups for r in s.rewards]
        own = [s for s in batch.groups if not s.external]
        metrics: dict[str, Any] = {
            "reward": reward,
            "cumulative_reward": self.cumulative_reward,
            "batch_reward": float(np.mean(batch_rewards)) if batch_rewards else 0.0,
            "local_groups": batch.num_local,
            "external_groups": batch.num_external,
            "external_received": len(external),
            **{k: v for k, v in batch.stats.items() if k != "external_candidates"},
            **self.inbox.metrics(),  # what peers' records, groups and log-probs cost and were dropped for
            "time_generate": t1 - t0,
            "time_exchange": t2 - t1,
            "time_train": t3 - t2,
            "time_round": t3 - t0,
            **train,
            "local_mixed_groups": sum(1 for s in own if max(s.rewards) != min(s.rewards)),
            "malformed_answers": self.verifier.malformed,
        }
        for task in sorted({g.task for g in local}):
            # Exact answers only: reasoning-gym gives partial credit (e.g. 0.01) to some wrong ones.
            scores = [
                s >= 1.0
                for a in self._local
                if a.group.task == task
                for s in self.verifier.scores(a.item, a.group.completions)
            ]
            metrics[f"accuracy/{task}"] = float(np.mean(scores))
        return metrics

    def heldout_accuracy(self, items: dict[str, list[TaskItem]]) -> dict[str, float]:
        """Greedy exact-answer accuracy on held-out `items` per task, and their mean (evaluation.py)."""
        return greedy_accuracy(self.model, self.tokenizer, self.template, self.backend.cfg, items)

    def save(self, out_dir: Path) -> Path:
        """The trained policy as a save_pretrained directory (with its tokenizer)."""
        return save_model(self.model, self.tokenizer, out_dir)

    def close(self) -> None:
        self.verifier.close()

    # -- checkpoint state ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "cumulative_reward": self.cumulative_reward,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "advantage": self.advantage.state_dict(),
            "numpy_rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            **self.inbox.state_dict(),  # drop counts, replay marks, senders' merit
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.cumulative_reward = float(state["cumulative_reward"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.advantage.load_state_dict(state["advantage"])
        self.rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])
        self.inbox.load_state_dict(state)
