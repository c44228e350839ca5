"""What a SAPO node takes from its peers in one round: their records in, scored arrivals out.

    records -> decode   (PayloadDecoder: size caps before parsing, signatures, schema, replay)
            -> budget   (SenderBudget: merited senders first, each within its share of the round)
            -> clip     (the stop string and this node's max_new_tokens: the text scored is the text trained)
            -> dedupe   (a group equal to this node's own, or to an earlier sender's, is a copy)
            -> rebuild  (TaskMixture.rebuild: the entry from the address sent, never a peer's answer)
            -> align    (the sender's log-probs, `loss.external_is`, only where this tokenizer agrees)
            -> score    (the Verifier, every second charged to the sender)

Peer data is data. Nothing a peer sends raises out of `receive` or `rewards`, picks a code path, or
is used before a limit has been applied to it; every group, payload and set of log-probs that is
not used is counted under its reason (`group_drops`, `decoder.drops`, `logprob_drops`).

Every group is an `Arrival` owned by the identity that signed the payload it came in, never by its
content: a group equal to one this node generated, or to one an earlier sender sent this round, is
a duplicate, dropped and counted, so copying a node's groups neither claims nor censors them. A
peer's group is rebuilt and scored on arrival, and every second of that is charged to it, per
sender and per round in total; a sender over its allowance loses its groups for the round, each
handed first to the next sender of the same group still within its own (`_hand_over`).

With `loss.external_is`, a peer's log-probs are used only where its declared tokenizer fingerprint
is this node's and each completion re-tokenises here to exactly as many tokens as log-probs were
sent; they are cut with the text (`offpolicy.align_logprobs`). Otherwise they are dropped and
counted and the group trains uncorrected.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from decentrain.algorithms.sapo.batching import Arrival, ScoredGroup
from decentrain.algorithms.sapo.exchange import PeerRecord
from decentrain.algorithms.sapo.generation import clip_to_tokens
from decentrain.algorithms.sapo.offpolicy import align_logprobs
from decentrain.algorithms.sapo.payload import PayloadDecoder, PayloadLimits, RolloutGroup, RolloutPayload
from decentrain.algorithms.sapo.sender_budget import SenderBudget
from decentrain.tasks import EntryRef, PromptTemplate, TaskMixture, Verifier

logger = logging.getLogger(__name__)


class Unscorable(ValueError):
    """An external group this node will not score this round (counted in `group_drops[reason]`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def entry_ref(group: RolloutGroup) -> EntryRef:
    return EntryRef(group.task, group.config, group.seed, group.size, group.index)


def same_group(group: RolloutGroup) -> tuple:
    """What makes two groups the same training data: the entry, the question, the completions in any order."""
    return (
        group.task,
        group.config,
        group.seed,
        group.size,
        group.index,
        group.question,
        tuple(sorted(group.completions)),
    )


@dataclass
class Peek:
    """One round's first look at the records, for an exchange that waits for peers (`is_valid`, `ends_wait`).

    Each record that passes is verified and parsed once, here, and its payload kept for `Inbox.receive`,
    which records the verdict. Holding the record's data keeps its id from being reused by another's bytes.
    """

    round: int
    decoder: PayloadDecoder
    budget: SenderBudget
    checked: dict[int, tuple[Any, RolloutPayload]] = field(default_factory=dict)  # id(data) -> (data, payload)

    def when(self, rec: PeerRecord) -> tuple[int, float | None]:
        # A record with its own round comes from an asynchronous backend: rounds do not line up
        # across nodes there, so the signed timestamp must also be fresh.
        return (self.round, None) if rec.round is None else (rec.round, time.time())

    def payload(self, rec: PeerRecord) -> RolloutPayload | None:
        data, checked = self.checked.get(id(rec.data), (None, None))
        return checked if data is rec.data else None

    def is_valid(self, rec: PeerRecord) -> bool:
        if (checked := self.decoder.peek(rec.data, *self.when(rec))) is not None:
            self.checked[id(rec.data)] = (rec.data, checked)
        return checked is not None

    def ends_wait(self, rec: PeerRecord) -> bool:
        # Once some sender's groups rebuilt and scored here recently, only such a sender's record
        # ends the wait (and earns its key read priority): a member publishing valid payloads of
        # groups that never rebuild would otherwise close each round, and crowd the reads, before
        # a useful peer's record lands (benchmarks/swarm_attack sybils_64: ext/round 0.79).
        checked = self.payload(rec)
        return not self.budget.delivered or (checked is not None and checked.node_id in self.budget.delivered)


class Inbox:
    """One node's receive path.

    `limits`: the `payload` section; `key`: the swarm key (None: an open swarm); `own_id`: this node's
    wire id (its own payload coming back is not a peer's); `max_new_tokens`: this node's completion cap;
    `external_is`: keep peers' log-probs that check out; `score`: score groups on arrival (a node with
    J = 0 trains none of them). The verifier, mixture, template and tokenizer are the node's own.
    """

    def __init__(
        self,
        limits: PayloadLimits,
        key: str | bytes | None,
        own_id: str,
        *,
        verifier: Verifier,
        mixture: TaskMixture,
        template: PromptTemplate,
        tokenizer: Any,
        tokenizer_id: str,
        max_new_tokens: int,
        external_is: bool,
        score: bool,
        name: str = "node",
    ):
        self.limits, self.own_id, self.name = limits, own_id, name
        self.verifier, self.mixture, self.template, self.tokenizer = verifier, mixture, template, tokenizer
        self.tokenizer_id, self.max_new_tokens = tokenizer_id, max_new_tokens
        self.external_is, self.score = external_is, score
        self.decoder = PayloadDecoder(limits, key=key)
        self.budget = SenderBudget(limits.sender_budget_s, round_limit_s=limits.round_budget_s)
        self.group_drops: Counter[str] = Counter()  # peers' groups that were not used, by reason
        self.logprob_drops: Counter[str] = Counter()  # peers' log-probs that were not used, by reason

    def start_round(self) -> None:
        self.budget.start_round()

    def peek(self, round_: int) -> Peek:
        return Peek(round_, self.decoder, self.budget)

    # -- receive ---------------------------------------------------------------------------------

    def receive(self, records: list[PeerRecord], peek: Peek, own: list[Arrival]) -> list[Arrival]:
        """The peers' groups in `records` that rebuild and score here, each owned by its signer; `own`:
        this node's groups this round (their copies are duplicates)."""
        seen = dict(self.group_drops)
        by_sender = self._decode(records, peek)
        external: list[Arrival] = []
        owner: dict[tuple, str | None] = {same_group(a.group): None for a in own}  # None: this node
        copies: dict[tuple, list[str]] = {}  # later senders of a kept group
        for sender in self.budget.plan(by_sender):  # merited senders first: fresh keys cannot spend their share
            datasets: dict[str, tuple[int, int]] = {}
            for group, tokenizer_id in by_sender[sender]:
                if (arrival := self._admit(sender, group, tokenizer_id, datasets, owner, copies)) is not None:
                    external.append(arrival)
        external = self._hand_over(external, copies)
        for a in external:
            self.budget.deliver(a.sender)
        self._log_drops(peek.round, seen)
        return external

    def _decode(self, records: list[PeerRecord], peek: Peek) -> dict[str, list[tuple[RolloutGroup, str | None]]]:
        """Each accepted payload's groups by signer, with the tokenizer fingerprint their payload declared."""
        by_sender: dict[str, list[tuple[RolloutGroup, str | None]]] = {}
        for rec in records:
            if (checked := peek.payload(rec)) is not None:
                decoded = self.decoder.accept(checked, source=rec.source)
            else:  # an exchange that did not ask is_valid (a fixed list in tests): decode it here
                current, now = peek.when(rec)
                decoded = self.decoder(rec.data, current_round=current, source=rec.source, now=now)
            if decoded is not None and decoded.node_id != self.own_id:
                by_sender.setdefault(decoded.node_id, []).extend((g, decoded.tokenizer) for g in decoded.groups)
                if self.external_is:  # otherwise they are not used, checked or not
                    self.logprob_drops.update(decoded.logprob_drops)
        return by_sender

    def _admit(
        self,
        sender: str,
        g: RolloutGroup,
        tokenizer_id: str | None,
        datasets: dict[str, tuple[int, int]],
        owner: dict[tuple, str | None],
        copies: dict[tuple, list[str]],
    ) -> Arrival | None:
        """One peer's group as an arrival of `sender`, rebuilt (and scored), or None, counted and charged."""
        if self.budget.over(sender):
            self.group_drops["sender_over_budget" if sender in self.budget.dropped else "round_over_budget"] += 1
            return None
        # An honest peer draws each task from one dataset; more would make this node build
        # a dataset per group (word_sorting: ~15 ms each).
        if datasets.setdefault(g.task, (g.seed, g.size)) != (g.seed, g.size):
            self.group_drops["mixed_datasets"] += 1
            self.budget.charge(sender, self.limits.mismatch_cost_s)
            return None
        try:
            with self.budget.timed(sender):
                clipped = self.clip(g)
                key = same_group(clipped)
                if key in owner:  # this node's own group, or one an earlier sender sent
                    self.group_drops["duplicate"] += 1
                    copies.setdefault(key, []).append(sender)
                    return None
                item = self.mixture.rebuild(entry_ref(g), g.question, self.limits.max_dataset_size)
                logprobs = self._sender_logprobs(g, clipped, tokenizer_id)
        except Exception as e:  # EntryMismatch (has a reason); anything else a peer's group triggers is its cost too
            self.group_drops[getattr(e, "reason", "rebuild_error")] += 1
            self.budget.charge(sender, self.limits.mismatch_cost_s)
            return None
        owner[key] = sender
        arrival = Arrival(clipped, sender, item, sender_logprobs=logprobs)
        if self.score:  # scored now, so every budget decision is made here
            try:
                arrival = dataclasses.replace(arrival, rewards=tuple(self.rewards(arrival)))
            except Unscorable:
                del owner[key]  # a later sender of the same group may still have it scored
                return None
        return arrival

    def _hand_over(self, external: list[Arrival], copies: dict[tuple, list[str]]) -> list[Arrival]:
        """Drop the groups of senders that went over their allowance, each passed first to the next
        sender of the same group still in it (same entry and completions: the same training data),
        so sending first and then overspending cannot censor another peer's groups."""
        kept = []
        for a in external:
            if a.sender in self.budget.dropped:
                heir = next((s for s in copies.get(same_group(a.group), ()) if s not in self.budget.dropped), None)
                if heir is None:
                    self.group_drops["sender_over_budget"] += 1
                    continue
                a = dataclasses.replace(a, sender=heir, sender_logprobs=None)  # they were the dropped sender's
            kept.append(a)
        return kept

    def _log_drops(self, round_: int, seen: dict[str, int]) -> None:
        """One WARNING line per round for payloads, one for groups: a flood of junk is not a flood of lines."""
        self.decoder.drops.flush_log(f"{self.name} round {round_}: ")
        if dropped := {k: v - seen.get(k, 0) for k, v in self.group_drops.items() if v != seen.get(k, 0)}:
            logger.warning(
                "%s round %d: dropped %d peer group(s): %s",
                self.name,
                round_,
                sum(dropped.values()),
                ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())),
            )

    # -- clip, align, score ----------------------------------------------------------------------

    def clip(self, group: RolloutGroup) -> RolloutGroup:
        """`group` with each completion cut after its answer (the stop string, or the closing tag)
        and to this node's `max_new_tokens` in its own tokenizer: the text scored and trained here.
        The node cuts its own groups with it too."""
        completions = tuple(
            clip_to_tokens(self.template.cut(c), self.tokenizer, self.max_new_tokens) for c in group.completions
        )
        if completions == group.completions and group.logprobs is None:
            return group
        # the sender's log-probs are of the uncut text: only `_sender_logprobs` may carry them over
        return dataclasses.replace(group, completions=completions, logprobs=None)

    def _sender_logprobs(self, sent: RolloutGroup, clipped: RolloutGroup, tokenizer_id: str | None) -> tuple | None:
        """The sender's log-probs of `clipped`'s tokens here (`offpolicy.align_logprobs`), or None, counted."""
        if not self.external_is or sent.logprobs is None:
            return None
        if tokenizer_id != self.tokenizer_id:
            self.logprob_drops["no_tokenizer" if tokenizer_id is None else "tokenizer_mismatch"] += 1
            return None
        aligned = align_logprobs(self.tokenizer, sent.completions, clipped.completions, sent.logprobs)
        if aligned is None:
            self.logprob_drops["token_count_mismatch"] += 1
        return aligned

    def rewards(self, arrival: Arrival) -> list[float]:
        """The rewards of a group this node generated or received; this node's own never raise.

        A peer's group is scored once, when it arrives (`receive`), and keeps those rewards. Scoring
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
            logger.debug("%s: scoring a group of %s failed: %r", self.name, sender[:16], e)
            self.group_drops["scoring_error"] += 1
            self.budget.charge(sender, self.limits.mismatch_cost_s)
            raise Unscorable("scoring_error") from None
        self.budget.charge(sender, (self.verifier.malformed - malformed) * self.limits.malformed_cost_s)
        return rewards

    # -- merit, metrics, checkpoint state ---------------------------------------------------------

    def credit(self, batch: list[ScoredGroup]) -> None:
        """Merit: each sender's groups drawn into this node's batch (at most a fair share of J per round)."""
        for s in batch:
            if s.external:
                self.budget.credit(s.sender)

    def metrics(self) -> dict[str, Any]:
        return {
            "payloads_dropped": self.decoder.drops.total,
            **{f"dropped/{k}": v for k, v in self.decoder.drops.as_dict().items()},
            "groups_dropped": sum(self.group_drops.values()),
            "logprobs_dropped": sum(self.logprob_drops.values()),
            **{f"dropped_logprobs/{k}": v for k, v in self.logprob_drops.items()},
            **{f"dropped_groups/{k}": v for k, v in self.group_drops.items()},
            "senders_over_budget": self.budget.dropped_total,
            "rounds_receive_capped": self.budget.rounds_capped,
            "time_receive": self.budget.total,  # rebuild + scoring charged to senders this round
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "drops": self.decoder.drops.as_dict(),
            "group_drops": dict(self.group_drops),
            "logprob_drops": dict(self.logprob_drops),
            "high_water": dict(self.decoder.high_water),  # replay marks survive a restart
            "accepted": dict(self.decoder.accepted),
            "sender_merit": dict(self.budget.merit),  # the round budget's split survives a restart
            "sender_delivered": dict(self.budget.delivered),  # and so does whose records end a wait
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decoder.drops.counts.update(state["drops"])
        self.group_drops.update(state.get("group_drops", {}))
        self.logprob_drops.update(state.get("logprob_drops", {}))
        self.decoder.high_water.update({k: (int(r), float(t)) for k, (r, t) in state.get("high_water", {}).items()})
        self.decoder.accepted.update({k: int(n) for k, n in state.get("accepted", {}).items()})
        self.budget.merit.update({k: float(v) for k, v in state.get("sender_merit", {}).items()})
        self.budget.delivered.update({k: float(v) for k, v in state.get("sender_delivered", {}).items()})
