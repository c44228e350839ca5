"""One SAPO node: its own model, tokenizer, template, verifier and task mix, and one round of

    sample questions -> generate G completions each -> publish / fetch -> I local + J external
    groups -> re-tokenise and re-score here -> `num_iterations` clipped-ratio steps.

Peers' groups are scored only for tasks in this node's own mixture, against entries rebuilt here
from the address the peer sends (`TaskMixture.rebuild`); a group that does not rebuild to its
question is dropped and counted. Every group is an `Arrival` owned by the identity that signed
the payload it came in: a group equal to one this node generated, or to one an earlier sender
sent this round, is a duplicate, dropped and counted, so copying a node's groups neither claims
nor censors them. A peer's group is rebuilt and scored on arrival, and every second of that is
charged to it (`SenderBudget`, per sender and per round in total); a peer over its allowance
loses its groups for the round, and nothing a peer sends raises out of `run_round`. Completions, own and peers', are cut at the
stop string and at this node's `max_new_tokens` before they are scored, and that cut text is
what is trained. Payloads are signed with this node's Ed25519 key.

With `loss.external_is`, a node sends its sampling log-probs and tokenizer fingerprint, and uses a
peer's only where the fingerprint is its own and each completion re-tokenises here to exactly as
many tokens as log-probs were sent; they are cut with the text (`_sender_logprobs`). Otherwise
they are dropped and counted (`logprob_drops`) and the group trains uncorrected.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from decentrain.algorithms.sapo.batching import Arrival, build_swarm_batch, tokenize_batch
from decentrain.algorithms.sapo.config import SAPOConfig
from decentrain.algorithms.sapo.exchange import PeerRecord, RolloutExchange
from decentrain.algorithms.sapo.generation import build_generation_backend, clip_to_tokens, completion_logprobs
from decentrain.algorithms.sapo.grpo import (LossNorm, build_advantage_estimator, filter_off_policy_negatives, policy_loss,
                                             truncated_is_weight)
from decentrain.algorithms.sapo.offpolicy import align_logprobs, tokenizer_fingerprint
from decentrain.algorithms.sapo.prompts import build_template
from decentrain.algorithms.sapo.sender_budget import SenderBudget
from decentrain.core.identity import NodeIdentity
from decentrain.algorithms.sapo.payload import PayloadDecoder, RolloutGroup, RolloutPayload, encode_payload
from decentrain.models.factory import build_model, build_tokenizer
from decentrain.models.lora import trainable_parameters
from decentrain.tasks import EntryRef, TaskItem, TaskMixture, Verifier

logger = logging.getLogger(__name__)


def group_of(item: TaskItem, completions: tuple[str, ...], logprobs: tuple | None = None) -> RolloutGroup:
    """The wire form of a local group: the entry's address and question, never its answer."""
    ref = item.ref
    if ref is None:
        raise ValueError("only items built by a TaskMixture can be shared")
    return RolloutGroup(ref.task, ref.config, ref.seed, ref.size, ref.index, item.question, completions, logprobs)


def entry_ref(group: RolloutGroup) -> EntryRef:
    return EntryRef(group.task, group.config, group.seed, group.size, group.index)


class Unscorable(ValueError):
    """An external group this node will not score this round (counted in `group_drops[reason]`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _same_group(group: RolloutGroup) -> tuple:
    """What makes two groups the same training data: the entry, the question, the completions in any order."""
    return (group.task, group.config, group.seed, group.size, group.index, group.question, tuple(sorted(group.completions)))


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
        self.optimizer = torch.optim.AdamW(  # a LoRA model steps its adapters only
            trainable_parameters(self.model), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, betas=tuple(cfg.optim.betas)
        )
        self.template = build_template(cfg.template, self.tokenizer)  # plain text, or the tokenizer's chat template
        self.verifier = Verifier(self.template, cfg.reward)
        self.mixture = TaskMixture(cfg.task)
        self.backend = build_generation_backend(self.model, self.tokenizer, self.template.sampling(cfg.sampling))
        # bf16 matmuls in the policy step on CUDA (fp32 master weights and optimizer state): train.precision
        self.autocast = cfg.train.precision == "bf16_autocast" or (cfg.train.precision == "auto" and self.device.type == "cuda")
        self.advantage = build_advantage_estimator(cfg.loss)
        self.decoder = PayloadDecoder(cfg.payload, key=cfg.swarm_key)
        self.group_drops: Counter[str] = Counter()  # peers' groups that were not used, by reason
        self.logprob_drops: Counter[str] = Counter()  # peers' log-probs that were not used, by reason
        self.tokenizer_id = tokenizer_fingerprint(self.tokenizer)
        self._local: list[Arrival] = []  # this round's own groups, as scored and trained here
        self.budget = SenderBudget(cfg.payload.sender_budget_s, round_limit_s=cfg.payload.round_budget_s)
        self.rng = np.random.default_rng(self.seed)
        self.round = 0  # rounds completed
        self.cumulative_reward = 0.0

    @property
    def questions_per_round(self) -> int:
        return self.cfg.train.questions_per_round or max(self.cfg.batch.num_local, 1)

    def rewards(self, arrival: Arrival) -> list[float]:
        """The rewards of a group this node generated or received; this node's own never raise.

        A peer's group is scored once, when it arrives (`share`), and keeps those rewards. Scoring
        one raises `Unscorable` (counted) when its sender is over budget or the verifier fails on
        it; the sender is charged for the time and for malformed answers.
        """
        sender = arrival.sender
        if sender is None:
            return self.verifier.rewards(arrival.item, arrival.group.completions)
        if arrival.rewards is not None:
            return list(arrival.rewards)
        if self.budget.over(sender):
            self.group_drops["sender_over_budget"] += 1
            raise Unscorable("sender_over_budget")
        malformed = self.verifier.malformed
        try:
            with self.budget.timed(sender):
                rewards = self.verifier.rewards(arrival.item, arrival.group.completions)
        except Exception as e:  # a scorer bug on a peer's text must cost that peer, not the round
            logger.debug("%s: scoring a group of %s failed: %r", self.node_id, sender[:16], e)
            self.group_drops["scoring_error"] += 1
            self.budget.charge(sender, self.cfg.payload.mismatch_cost_s)
            raise Unscorable("scoring_error") from None
        self.budget.charge(sender, (self.verifier.malformed - malformed) * self.cfg.payload.malformed_cost_s)
        return rewards

    def clip(self, group: RolloutGroup) -> RolloutGroup:
        """`group` with each completion cut after its answer (the stop string, or the closing tag)
        and to this node's `max_new_tokens` in its own tokenizer: the text scored and trained here."""
        cap = self.cfg.sampling.max_new_tokens
        completions = tuple(clip_to_tokens(self.template.cut(c), self.tokenizer, cap) for c in group.completions)
        if completions == group.completions and group.logprobs is None:
            return group
        # the sender's log-probs are of the uncut text: only `_sender_logprobs` may carry them over
        return dataclasses.replace(group, completions=completions, logprobs=None)

    def _sender_logprobs(self, sent: RolloutGroup, clipped: RolloutGroup, tokenizer_id: str | None) -> tuple | None:
        """The sender's log-probs of `clipped`'s tokens here (`offpolicy.align_logprobs`), or None, counted."""
        if not self.cfg.loss.external_is or sent.logprobs is None:
            return None
        if tokenizer_id != self.tokenizer_id:
            self.logprob_drops["no_tokenizer" if tokenizer_id is None else "tokenizer_mismatch"] += 1
            return None
        aligned = align_logprobs(self.tokenizer, sent.completions, clipped.completions, sent.logprobs)
        if aligned is None:
            self.logprob_drops["token_count_mismatch"] += 1
        return aligned

    # -- the round -------------------------------------------------------------------------------

    def generate(self, round_: int) -> list[RolloutGroup]:
        n = self.questions_per_round
        if self.cfg.train.prioritized_sampling:
            pool = self.mixture.sample(n * self.cfg.train.candidates_factor, self.rng)
            p = self.advantage.sampling_weights([self.template(it.question) for it in pool])
            items = [pool[int(i)] for i in self.rng.choice(len(pool), size=n, replace=False, p=p)]
        else:
            items = self.mixture.sample(n, self.rng)
        prompts, g, seed = [self.template(it.question) for it in items], self.cfg.loss.num_generations, self.seed * 100_003 + round_
        if self.cfg.loss.external_is:  # peers correct against what this node sampled with
            completions, logprobs = self.backend.generate_scored(prompts, g, seed=seed)
        else:
            completions, logprobs = self.backend.generate(prompts, g, seed=seed), [None] * len(items)
        groups = [group_of(it, tuple(c), None if lp is None else tuple(lp))
                  for it, c, lp in zip(items, completions, logprobs)]
        self._local = [Arrival(self.clip(g), None, it) for g, it in zip(groups, items)]
        return groups

    def share(self, round_: int, local: list[RolloutGroup]) -> list[Arrival]:
        """Publish `local`; return the peers' groups that rebuild here, each owned by its signer."""
        payload = RolloutPayload(self.identity.node_id, round_, time.time(), tuple(local), name=self.node_id,
                                 tokenizer=self.tokenizer_id if self.cfg.loss.external_is else None)
        seen_groups = dict(self.group_drops)

        def when(rec: PeerRecord) -> tuple[int, float | None]:
            # A record with its own round comes from an asynchronous backend: rounds do not line
            # up across nodes there, so the signed timestamp must also be fresh.
            return (round_, None) if rec.round is None else (rec.round, time.time())

        # id(record data) -> (that data, its payload) for the records that pass: verified and parsed
        # once, here. Holding the data keeps its id from being reused by another record's bytes.
        peeked: dict[int, tuple[Any, RolloutPayload]] = {}

        def peeked_payload(rec: PeerRecord) -> RolloutPayload | None:
            data, checked = peeked.get(id(rec.data), (None, None))
            return checked if data is rec.data else None

        def is_valid(rec: PeerRecord) -> bool:
            if (checked := self.decoder.peek(rec.data, *when(rec))) is not None:
                peeked[id(rec.data)] = (rec.data, checked)
            return checked is not None

        def ends_wait(rec: PeerRecord) -> bool:
            # Once some sender's groups rebuilt and scored here recently, only such a sender's record
            # ends the wait (and earns its key read priority): a member publishing valid payloads of
            # groups that never rebuild would otherwise close each round, and crowd the reads, before
            # a useful peer's record lands (benchmarks/swarm_attack sybils_64: ext/round 0.79).
            checked = peeked_payload(rec)
            return not self.budget.delivered or (checked is not None and checked.node_id in self.budget.delivered)

        wire = encode_payload(payload, self.identity, self.cfg.swarm_key)
        by_sender: dict[str, list[RolloutGroup]] = {}
        tokenizer_of: dict[int, str | None] = {}  # id(group) -> the fingerprint its payload declared
        for rec in self.exchange.exchange(round_, wire, is_valid=is_valid, ends_wait=ends_wait):
            if (checked := peeked_payload(rec)) is not None:
                decoded = self.decoder.accept(checked, source=rec.source)
            else:  # an exchange that did not ask is_valid (a fixed list in tests): decode it here
                current, now = when(rec)
                decoded = self.decoder(rec.data, current_round=current, source=rec.source, now=now)
            if decoded is not None and decoded.node_id != self.identity.node_id:
                by_sender.setdefault(decoded.node_id, []).extend(decoded.groups)
                tokenizer_of.update((id(g), decoded.tokenizer) for g in decoded.groups)
                if self.cfg.loss.external_is:  # otherwise they are not used, checked or not
                    self.logprob_drops.update(decoded.logprob_drops)
        external: list[Arrival] = []
        owner: dict[tuple, str | None] = {_same_group(a.group): None for a in self._local}  # None: this node
        copies: dict[tuple, list[str]] = {}  # later senders of a kept group
        for sender in self.budget.plan(by_sender):  # merited senders first: fresh keys cannot spend their share
            datasets: dict[str, tuple[int, int]] = {}
            for g in by_sender[sender]:
                if self.budget.over(sender):
                    self.group_drops["sender_over_budget" if sender in self.budget.dropped else "round_over_budget"] += 1
                    continue
                # An honest peer draws each task from one dataset; more would make this node build
                # a dataset per group (word_sorting: ~15 ms each).
                if datasets.setdefault(g.task, (g.seed, g.size)) != (g.seed, g.size):
                    self.group_drops["mixed_datasets"] += 1
                    self.budget.charge(sender, self.cfg.payload.mismatch_cost_s)
                    continue
                try:
                    with self.budget.timed(sender):
                        clipped = self.clip(g)
                        key = _same_group(clipped)
                        if key in owner:  # this node's own group, or one an earlier sender sent
                            self.group_drops["duplicate"] += 1
                            copies.setdefault(key, []).append(sender)
                            continue
                        item = self.mixture.rebuild(entry_ref(g), g.question, self.cfg.payload.max_dataset_size)
                        logprobs = self._sender_logprobs(g, clipped, tokenizer_of.get(id(g)))
                except Exception as e:  # EntryMismatch (has a reason); anything else a peer's group triggers is its cost too
                    self.group_drops[getattr(e, "reason", "rebuild_error")] += 1
                    self.budget.charge(sender, self.cfg.payload.mismatch_cost_s)
                    continue
                owner[key] = sender
                arrival = Arrival(clipped, sender, item, sender_logprobs=logprobs)
                if self.cfg.batch.num_external:  # scored now, so every budget decision is made here
                    try:
                        arrival = dataclasses.replace(arrival, rewards=tuple(self.rewards(arrival)))
                    except Unscorable:
                        del owner[key]  # a later sender of the same group may still have it scored
                        continue
                external.append(arrival)
        external = self._hand_over(external, copies)
        for a in external:
            self.budget.deliver(a.sender)
        self.decoder.drops.flush_log(f"{self.node_id} round {round_}: ")
        if dropped := {k: v - seen_groups.get(k, 0) for k, v in self.group_drops.items() if v != seen_groups.get(k, 0)}:
            logger.warning("%s round %d: dropped %d peer group(s): %s", self.node_id, round_,
                           sum(dropped.values()), ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())))
        return external

    def _hand_over(self, external: list[Arrival], copies: dict[tuple, list[str]]) -> list[Arrival]:
        """Drop the groups of senders that went over their allowance, each passed first to the next
        sender of the same group still in it (same entry and completions: the same training data),
        so sending first and then overspending cannot censor another peer's groups."""
        kept = []
        for a in external:
            if a.sender in self.budget.dropped:
                heir = next((s for s in copies.get(_same_group(a.group), ()) if s not in self.budget.dropped), None)
                if heir is None:
                    self.group_drops["sender_over_budget"] += 1
                    continue
                a = dataclasses.replace(a, sender=heir, sender_logprobs=None)  # they were the dropped sender's
            kept.append(a)
        return kept

    def train_step(self, batch_groups) -> dict[str, float]:
        cfg = self.cfg
        tb = tokenize_batch(batch_groups, self.tokenizer, self.template, cfg.train.max_prompt_tokens, cfg.sampling.max_new_tokens)
        tensors = [t.to(self.device) for t in (tb.prompt_ids, tb.prompt_mask, tb.completion_ids, tb.completion_mask)]
        advantages = self.advantage(tb.prompts, tb.rewards).reshape(-1).to(self.device)
        mb = cfg.train.micro_batch_size
        temperature = cfg.sampling.temperature or 1.0
        norm = LossNorm.from_mask(tb.completion_mask, mb)
        # peers' sampling log-probs and where they are known ([N, C] each), for `loss.external_is`
        sender = None if not cfg.loss.external_is or tb.sender_logps is None else [
            tb.sender_logps.to(self.device), tb.sender_mask.to(self.device)]
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
                            kept.append(filter_off_policy_negatives(old, sender[0][sl], sender[1][sl], adv, cfg.loss.ftis_kl))
                        adv = adv * kept[k]
                loss, stats = policy_loss(
                    logps, adv, tensors[3][sl], cfg.loss, norm,
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
            out.update(is_tokens=float(w.numel()), is_weight_mean=w.mean().item(), is_weight_min=w.min().item(),
                       is_weight_max=w.max().item(), is_capped=(w >= cfg.loss.external_is_cap).float().mean().item())
        return out

    def run_round(self) -> dict[str, Any]:
        """One full round; returns its metrics."""
        round_ = self.round
        self._local = []
        self.budget.start_round()
        t0 = time.perf_counter()
        local = self.generate(round_)
        t1 = time.perf_counter()
        external = self.share(round_, local)
        t2 = time.perf_counter()
        batch = build_swarm_batch(self._local, external, self.rewards, self.cfg.batch, self.rng)
        own = [s for s in batch.groups if not s.external]
        for s in batch.groups:  # merit: groups drawn into a batch, at most a fair share of J per round
            if s.external:
                self.budget.credit(s.sender)
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
            "logprobs_dropped": sum(self.logprob_drops.values()),
            **{f"dropped_logprobs/{k}": v for k, v in self.logprob_drops.items()},
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
        metrics["rounds_receive_capped"] = self.budget.rounds_capped
        metrics["time_receive"] = self.budget.total  # rebuild + scoring charged to senders this round
        for task in sorted({g.task for g in local}):
            # Exact answers only: reasoning-gym gives partial credit (e.g. 0.01) to some wrong ones.
            scores = [s >= 1.0 for a in self._local if a.group.task == task
                      for s in self.verifier.scores(a.item, a.group.completions)]
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
            "logprob_drops": dict(self.logprob_drops),
            "high_water": dict(self.decoder.high_water),  # replay marks survive a restart
            "accepted": dict(self.decoder.accepted),
            "sender_merit": dict(self.budget.merit),  # the round budget's split survives a restart
            "sender_delivered": dict(self.budget.delivered),  # and so does whose records end a wait
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
        self.logprob_drops.update(state.get("logprob_drops", {}))
        self.decoder.high_water.update({k: (int(r), float(t)) for k, (r, t) in state.get("high_water", {}).items()})
        self.decoder.accepted.update({k: int(n) for k, n in state.get("accepted", {}).items()})
        self.budget.merit.update({k: float(v) for k, v in state.get("sender_merit", {}).items()})
        self.budget.delivered.update({k: float(v) for k, v in state.get("sender_delivered", {}).items()})
