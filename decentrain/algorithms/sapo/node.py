"""One SAPO node: its own model, tokenizer, template, verifier and task mix, and one round of

    sample questions -> generate G completions each -> publish / fetch -> I local + J external
    groups -> re-tokenise and re-score here -> `num_iterations` clipped-ratio steps.

Peers' groups are scored only for tasks in this node's own mixture, against entries rebuilt here
from the address the peer sends (`TaskMixture.rebuild`); a group that does not rebuild to its
question is dropped and counted. Every second of rebuild and scoring a peer causes is charged
to it (`SenderBudget`); a peer over budget is dropped for the round. Payloads are signed with
this node's Ed25519 key.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from decentrain.algorithms.sapo.batching import build_swarm_batch, tokenize_batch
from decentrain.algorithms.sapo.budget import SenderBudget
from decentrain.algorithms.sapo.config import SAPOConfig
from decentrain.algorithms.sapo.exchange import PeerRecord, RolloutExchange
from decentrain.algorithms.sapo.generation import build_generation_backend, completion_logprobs
from decentrain.algorithms.sapo.grpo import LossNorm, build_advantage_estimator, policy_loss
from decentrain.core.identity import NodeIdentity
from decentrain.algorithms.sapo.payload import PayloadDecoder, RolloutGroup, RolloutPayload, encode_payload
from decentrain.models.factory import build_model, build_tokenizer
from decentrain.tasks import EntryMismatch, EntryRef, PromptTemplate, TaskItem, TaskMixture, Verifier

logger = logging.getLogger(__name__)


def group_of(item: TaskItem, completions: tuple[str, ...]) -> RolloutGroup:
    """The wire form of a local group: the entry's address and question, never its answer."""
    ref = item.ref
    if ref is None:
        raise ValueError("only items built by a TaskMixture can be shared")
    return RolloutGroup(ref.task, ref.config, ref.seed, ref.size, ref.index, item.question, completions)


def entry_ref(group: RolloutGroup) -> EntryRef:
    return EntryRef(group.task, group.config, group.seed, group.size, group.index)


def _trim_padding(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Drop the all-padding columns left after removing rows: prompts' left, completions' right."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = tensors
    if prompt_ids.size(0) == 0:
        return tensors
    p = max(int(prompt_mask.sum(1).max()), 1)
    c = max(int(completion_mask.sum(1).max()), 1)
    return [prompt_ids[:, -p:], prompt_mask[:, -p:], completion_ids[:, :c], completion_mask[:, :c]]


class SAPONode:
    def __init__(self, cfg: SAPOConfig, node_index: int, node_id: str, exchange: RolloutExchange,
                 device: torch.device | None = None, identity: NodeIdentity | None = None):
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
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, betas=tuple(cfg.optim.betas)
        )
        self.template = PromptTemplate(cfg.template)
        self.verifier = Verifier(self.template, cfg.reward)
        self.mixture = TaskMixture(cfg.task)
        sampling = copy.copy(cfg.sampling)
        sampling.stop = cfg.template.stop if cfg.template.answer_format == "line" else sampling.stop
        self.backend = build_generation_backend(self.model, self.tokenizer, sampling)
        self.advantage = build_advantage_estimator(cfg.loss)
        self.decoder = PayloadDecoder(cfg.payload, key=cfg.swarm_key)
        self.group_drops: Counter[str] = Counter()  # peers' groups that did not rebuild, by reason
        self._items: dict[RolloutGroup, TaskItem] = {}  # this round's trusted item per group
        self._origin: dict[RolloutGroup, str] = {}  # this round's external groups -> sender key
        self.budget = SenderBudget(cfg.payload.sender_budget_s)
        self.rng = np.random.default_rng(self.seed)
        self.round = 0  # rounds completed
        self.cumulative_reward = 0.0

    @property
    def questions_per_round(self) -> int:
        return self.cfg.train.questions_per_round or max(self.cfg.batch.num_local, 1)

    def rewards(self, group: RolloutGroup) -> list[float]:
        item = self._items.get(group)
        if item is None:  # never happens for groups that came through generate() or share()
            raise ValueError("group was not rebuilt by this node")
        sender = self._origin.get(group)
        if sender is not None and self.budget.over(sender):
            raise ValueError("sender is over its cost budget this round")
        malformed = self.verifier.malformed
        with self.budget.timed(sender):
            rewards = self.verifier.rewards(item, group.completions)
        if sender is not None:
            self.budget.charge(sender, (self.verifier.malformed - malformed) * self.cfg.payload.malformed_cost_s)
        return rewards

    # -- the round -------------------------------------------------------------------------------

    def generate(self, round_: int) -> list[RolloutGroup]:
        n = self.questions_per_round
        if self.cfg.train.prioritized_sampling:
            pool = self.mixture.sample(n * self.cfg.train.candidates_factor, self.rng)
            p = self.advantage.sampling_weights([self.template(it.question) for it in pool])
            items = [pool[int(i)] for i in self.rng.choice(len(pool), size=n, replace=False, p=p)]
        else:
            items = self.mixture.sample(n, self.rng)
        completions = self.backend.generate(
            [self.template(it.question) for it in items], self.cfg.loss.num_generations, seed=self.seed * 100_003 + round_
        )
        groups = []
        for it, c in zip(items, completions):
            groups.append(group_of(it, tuple(c)))
            self._items[groups[-1]] = it
        return groups

    def share(self, round_: int, local: list[RolloutGroup]) -> list[RolloutGroup]:
        payload = RolloutPayload(self.identity.node_id, round_, time.time(), tuple(local), name=self.node_id)
        external, seen_groups = [], dict(self.group_drops)

        def when(rec: PeerRecord) -> tuple[int, float | None]:
            # A record with its own round comes from an asynchronous backend: rounds do not line
            # up across nodes there, so the signed timestamp must also be fresh.
            return (round_, None) if rec.round is None else (rec.round, time.time())

        def is_valid(rec: PeerRecord) -> bool:
            return self.decoder.would_accept(rec.data, *when(rec))

        wire = encode_payload(payload, self.identity, self.cfg.swarm_key)
        for rec in self.exchange.exchange(round_, wire, is_valid=is_valid):
            current, now = when(rec)
            decoded = self.decoder(rec.data, current_round=current, source=rec.source, now=now)
            if decoded is None or decoded.node_id == self.identity.node_id:
                continue
            datasets: dict[str, tuple[int, int]] = {}
            sender = decoded.node_id
            for g in decoded.groups:
                if self.budget.over(sender):
                    self.group_drops["sender_over_budget"] += 1
                    continue
                # An honest peer draws each task from one dataset; more would make this node build
                # a dataset per group (word_sorting: ~15 ms each).
                if datasets.setdefault(g.task, (g.seed, g.size)) != (g.seed, g.size):
                    self.group_drops["mixed_datasets"] += 1
                    self.budget.charge(sender, self.cfg.payload.mismatch_cost_s)
                    continue
                t = time.perf_counter()
                try:
                    self._items[g] = self.mixture.rebuild(entry_ref(g), g.question, self.cfg.payload.max_dataset_size)
                    self._origin.setdefault(g, sender)
                except EntryMismatch as e:
                    self.group_drops[e.reason] += 1
                    self.budget.charge(sender, time.perf_counter() - t + self.cfg.payload.mismatch_cost_s)
                    continue
                self.budget.charge(sender, time.perf_counter() - t)
                external.append(g)
        self.decoder.drops.flush_log(f"{self.node_id} round {round_}: ")
        if dropped := {k: v - seen_groups.get(k, 0) for k, v in self.group_drops.items() if v != seen_groups.get(k, 0)}:
            logger.warning("%s round %d: dropped %d peer group(s) that do not rebuild here: %s", self.node_id, round_,
                           sum(dropped.values()), ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())))
        return external

    def train_step(self, batch_groups) -> dict[str, float]:
        cfg = self.cfg
        tb = tokenize_batch(batch_groups, self.tokenizer, self.template, cfg.train.max_prompt_tokens, cfg.sampling.max_new_tokens)
        tensors = [t.to(self.device) for t in (tb.prompt_ids, tb.prompt_mask, tb.completion_ids, tb.completion_mask)]
        advantages = self.advantage(tb.prompts, tb.rewards).reshape(-1).to(self.device)
        mb = cfg.train.micro_batch_size
        temperature = cfg.sampling.temperature or 1.0
        norm = LossNorm.from_mask(tb.completion_mask, mb)
        if cfg.loss.beta == 0 and cfg.loss.loss_type != "bnpo":
            # A completion with zero advantage adds nothing to the gradient when there is no KL term,
            # so it is skipped; `norm` still counts it, so the loss equals the full batch's.
            keep = advantages != 0
            tensors, advantages = _trim_padding([t[keep] for t in tensors]), advantages[keep]
        old_logps = ref_logps = None
        with torch.no_grad():
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
        for _ in range(cfg.loss.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for i in range(0, n, mb):
                sl = slice(i, i + mb)
                logps = completion_logprobs(self.model, *(t[sl] for t in tensors), mb, temperature)
                loss, stats = policy_loss(
                    logps, advantages[sl], tensors[3][sl], cfg.loss, norm,
                    old_logps=None if old_logps is None else old_logps[sl],
                    ref_logps=None if ref_logps is None else ref_logps[sl],
                )
                loss.backward()
                loss_sum += loss.detach().float()
                clip_sum += stats["clip_ratio"].float() / norm.num_micro_batches
            if cfg.optim.grad_clip > 0:
                grad_sum += torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip).float()
            self.optimizer.step()
        totals["loss"], totals["clip_ratio"], totals["grad_norm"] = torch.stack([loss_sum, clip_sum, grad_sum]).tolist()
        iters = cfg.loss.num_iterations
        return {k: v if k == "trained_completions" else v / iters for k, v in totals.items()}

    def run_round(self) -> dict[str, Any]:
        """One full round; returns its metrics."""
        round_ = self.round
        self._items.clear()
        self._origin.clear()
        self.budget.start_round()
        t0 = time.perf_counter()
        local = self.generate(round_)
        t1 = time.perf_counter()
        external = self.share(round_, local)
        t2 = time.perf_counter()
        batch = build_swarm_batch(local, external, self.rewards, self.cfg.batch, self.rng)
        own = [s for s in batch.groups if not s.external]
        # Reward of this node's own rollouts: comparable across I/J splits (external ones are peers').
        own_rewards = [r for g in local for r in self.rewards(g)]
        reward = float(np.mean(own_rewards)) if own_rewards else 0.0
        train = self.train_step(batch.groups) if batch.groups else {}
        t3 = time.perf_counter()
        self.round += 1
        self.cumulative_reward += reward
        # genrl's `train/rewards`: the mean over the training batch, external groups included (these
        # rise mechanically: a kept external group holds at least one correct answer).
        batch_rewards = [r for s in batch.groups for r in s.rewards]
        metrics: dict[str, Any] = {
            "reward": reward,
            "cumulative_reward": self.cumulative_reward,
            "batch_reward": float(np.mean(batch_rewards)) if batch_rewards else 0.0,
            "local_groups": batch.num_local,
            "external_groups": batch.num_external,
            "external_received": len(external),
            **{k: v for k, v in batch.stats.items() if k != "external_candidates"},
            "payloads_dropped": self.decoder.drops.total,
            **{f"dropped/{k}": v for k, v in self.decoder.drops.as_dict().items()},
            "groups_dropped": sum(self.group_drops.values()),
            **{f"dropped_groups/{k}": v for k, v in self.group_drops.items()},
            "time_generate": t1 - t0,
            "time_exchange": t2 - t1,
            "time_train": t3 - t2,
            "time_round": t3 - t0,
            **train,
        }
        metrics["local_mixed_groups"] = sum(1 for s in own if max(s.rewards) != min(s.rewards))
        metrics["malformed_answers"] = self.verifier.malformed
        metrics["senders_over_budget"] = self.budget.dropped_total
        for task in sorted({g.task for g in local}):
            # Exact answers only: reasoning-gym gives partial credit (e.g. 0.01) to some wrong ones.
            scores = [s >= 1.0 for g in local if g.task == task for s in self.verifier.scores(self._items[g], g.completions)]
            metrics[f"accuracy/{task}"] = float(np.mean(scores))
        return metrics

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
            "drops": self.decoder.drops.as_dict(),
            "group_drops": dict(self.group_drops),
            "high_water": dict(self.decoder.high_water),  # replay marks survive a restart
            "accepted": dict(self.decoder.accepted),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.cumulative_reward = float(state["cumulative_reward"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.advantage.load_state_dict(state["advantage"])
        self.rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])
        self.decoder.drops.counts.update(state["drops"])
        self.group_drops.update(state.get("group_drops", {}))
        self.decoder.high_water.update({k: (int(r), float(t)) for k, (r, t) in state.get("high_water", {}).items()})
        self.decoder.accepted.update({k: int(n) for k, n in state.get("accepted", {}).items()})
