"""Compressed NoLoCo: both quantities of the pair step travel top-k + low-bit, the learning one error-fed.

NoLoCo's step (γ = β = η, momentum μ; φ slow weights, θ fast weights, Δ = φ − θ) for a
gossip group G (a pair, or a triple with odd_world=triple) is

    g_i = φ_i − θ̄_G = mean_G(Δ) − (mean_G(φ) − φ_i)
    m_i ← μ·m_i − η·g_i ;  φ_i ← φ_i + m_i ;  θ_i ← φ_i

so a replica needs two things from its partner: its pseudo-gradient Δ_j (the learning
signal, an increment) and its slow weights φ_j (the consensus signal, a state). Here
(C = Q_b∘TopK_k and D as in algorithms/outer/compression.py):

  learning:   e_i ← β·e_i + Δ_i ;  c_i = C(e_i) ;  e_i ← e_i − D(c_i)      (error feedback)
  consensus:  s_i = C'(φ_i − A)                                              (fresh, no EF)
  step:       ĝ_i = agg_G D(c) − (mean_G D(s) − D(s_i))

agg_G is `compression.aggregation`: by default each index's mean over the group members whose c
carries it (SparseLoCo's reference rule, outer/compression.py), or "sum_over_replicas",
(1/|G|)·Σ_G D(c). The consensus term stays a plain mean: an entry neither side sent is taken as
equal on both, a zero difference.

with A an anchor every replica holds identically: A_0 = φ_0 (identical after the start-up
broadcast) and, every K = `anchor_every` rounds, A ← A + mean_r D(s_r) over all replicas (one
all-gather of the s payloads, decoded and summed in rank order, so A stays identical).

Why this form:
  - The learning term uses the *decoded* c on both sides, the replica's own included, so
    both members of a pair apply the same mean learning update (as SparseLoCo's replicas all
    apply the same decoded mean); e_i re-sends what was dropped to whichever partner comes
    next, so the buffer is per replica, not per partner, and random pairings need no
    per-peer state. That part is EF-compressed SGD (DeMo, arXiv 2411.19870; SparseLoCo,
    arXiv 2508.15706).
  - A state cannot be error-fed without a reference both sides share, and random pairs share
    no history; the anchor is that reference. The consensus term uses the *difference* of the
    two compressed drifts, D(s_j) − D(s_i), not A + D(s_j) − φ_i: what neither replica sends is
    then not pulled towards the stale anchor (a bias towards A that would undo progress), and
    the term is antisymmetric within a pair, so the pair's mean φ is what it would be
    uncompressed. Its error is bounded by one round's tail and quantisation step and does not
    accumulate; it is gossip with a bounded perturbation, contracting as in CHOCO-gossip
    (Koloskova et al., arXiv 1902.00340) while the perturbation is below the disagreement.
    The re-anchor keeps φ − A (and so that error) small: at most K rounds of updates.
  - A partner that is late, gone or sends a payload that fails decoding costs the round's
    mixing only: ĝ_i = D(c_i) (G = {i}); e_i keeps the rest.

Cost per round and replica ≈ |c| + |s| bytes to each partner (sparse_payload's layout: 2-byte
index + b bits per kept value, one fp32 scale per chunk, a 32-byte header) plus, every K
rounds, its share of a ring all-gather of the s payloads. Departures, named: NoLoCo's
"no collective after start-up" becomes one all-gather of small payloads every K rounds
(anchor_every=0 turns it off: the anchor stays A_0 and s grows with training); the γ ≠ β
general form is not supported compressed; both messages use flat chunks of `chunk_size` and the
max-abs quantiser (outer/compression.py's `flat` layout, not SparseLoCo's per-tensor tiles and
statistical quantiser: the consensus message is a state difference whose chunks need one scale
each, and the two messages share the chunk layout).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from decentrain.algorithms.outer.compression import (
    AGGREGATIONS,
    BITS,
    MAX_CHUNK,
    CompressionSpec,
    ErrorFeedback,
    compress,
    decompress,
    sent_mask,
)
from decentrain.algorithms.outer.sparse_payload import decode, encode, payload_bytes
from decentrain.core.config_checks import check_range

log = logging.getLogger(__name__)


@dataclass
class NoLoCoCompressionConfig:
    """`algorithm.compression` of NoLoCo (off by default)."""

    enabled: bool = False
    ef_decay: float = 0.95  # β of e ← β·e + Δ
    chunk_size: int = 4096  # C: entries per top-k chunk, both messages
    topk: int = 64  # k of the learning message c (64/4096 = 1.56 %)
    bits: int = 2  # b of c
    state_topk: int = 32  # k' of the consensus message s
    state_bits: int = 4  # b' of s
    anchor_every: int = 10  # K: rounds between re-anchors (one all-gather of s); 0: never
    aggregation: str = "mean_over_senders"  # agg_G of the learning term, or "sum_over_replicas"

    def __post_init__(self) -> None:
        for f in ("chunk_size", "topk", "bits", "state_topk", "state_bits", "anchor_every"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"algorithm.compression.{f}={v!r} must be an integer")
        check_range("algorithm.compression.ef_decay", self.ef_decay, 0, 1)
        AGGREGATIONS.get(self.aggregation, field="algorithm.compression.aggregation")
        check_range("algorithm.compression.chunk_size", self.chunk_size, 1, MAX_CHUNK)
        check_range("algorithm.compression.topk", self.topk, 1, self.chunk_size)
        check_range("algorithm.compression.state_topk", self.state_topk, 1, self.chunk_size)
        check_range("algorithm.compression.anchor_every", self.anchor_every, 0, 1 << 20)
        for f in ("bits", "state_bits"):
            if getattr(self, f) not in BITS:
                raise ValueError(f"algorithm.compression.{f}={getattr(self, f)} is unknown; allowed: {list(BITS)}")


def _spec(numel: int, chunk: int, k: int, bits: int) -> CompressionSpec:
    chunk = min(chunk, numel)
    return CompressionSpec.flat(numel, chunk, min(k, chunk), bits, "maxabs")


def _as_tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def step_direction(learn: Tensor, own_s: Tensor, partner_s: list[Tensor]) -> Tensor:
    """ĝ_i = learn − (mean_G D(s) − D(s_i)), learn = agg_G D(c), from decoded flat tensors (G = self + partners)."""
    pull = torch.zeros_like(own_s)
    for s in partner_s:
        pull += s - own_s
    return learn - pull / (len(partner_s) + 1)


@dataclass
class Decoded:
    """One group member's decoded messages: D(c), where c carries an index (`sent_mask`), and D(s)."""

    c: Tensor
    sent: Tensor
    s: Tensor


class CompressedGossip:
    """One replica's compression state (error buffer e, anchor A) and its messages."""

    def __init__(self, cfg: NoLoCoCompressionConfig, phi: Tensor):
        numel = phi.numel()
        self.cfg = cfg
        self.delta_spec = _spec(numel, cfg.chunk_size, cfg.topk, cfg.bits)
        self.state_spec = _spec(numel, cfg.chunk_size, cfg.state_topk, cfg.state_bits)
        self.ef = ErrorFeedback(self.delta_spec, cfg.ef_decay, phi.device)
        self.aggregate = AGGREGATIONS.get(cfg.aggregation)
        self.anchor = phi.detach().float().clone()  # A_0 = φ_0, identical on every replica after the broadcast
        self.dropped = 0  # partner payloads that failed decoding, over the run

    @property
    def message_bytes(self) -> tuple[int, int]:
        return payload_bytes(self.delta_spec), payload_bytes(self.state_spec)

    @torch.no_grad()
    def messages(self, delta: Tensor, phi: Tensor, round_idx: int) -> tuple[Tensor, Tensor, Decoded]:
        """(c bytes, s bytes, their decoding) of this round; advances the error buffer."""
        c = self.ef.step(delta)
        s = compress(phi.float() - self.anchor, self.state_spec)
        return (
            _as_tensor(encode(c, self.delta_spec, round_idx)),
            _as_tensor(encode(s, self.state_spec, round_idx)),
            Decoded(decompress(c, self.delta_spec), sent_mask(c, self.delta_spec), decompress(s, self.state_spec)),
        )

    def learning_term(self, group: list[Decoded]) -> Tensor:
        """agg_G D(c) over the group's decoded messages (own first)."""
        return self.aggregate([d.c for d in group], [d.sent for d in group])

    def decode_pair(self, c_bytes: Tensor, s_bytes: Tensor, round_idx: int) -> tuple[Decoded | None, str]:
        """A partner's decoded messages, or (None, why) when either payload fails its checks (peer bytes are data)."""
        c, why = decode(c_bytes.cpu().numpy().tobytes(), self.delta_spec, round_idx)
        if c is None:
            return None, f"learning payload: {why}"
        s, why = decode(s_bytes.cpu().numpy().tobytes(), self.state_spec, round_idx)
        if s is None:
            return None, f"consensus payload: {why}"
        dev = self.anchor.device
        return Decoded(
            decompress(c, self.delta_spec).to(dev),
            sent_mask(c, self.delta_spec).to(dev),
            decompress(s, self.state_spec).to(dev),
        ), ""

    def reanchor_due(self, round_idx: int) -> bool:
        return self.cfg.anchor_every > 0 and (round_idx + 1) % self.cfg.anchor_every == 0

    @torch.no_grad()
    def reanchor(self, gathered: list[bytes], round_idx: int) -> int:
        """A ← A + mean_r D(s_r) over the payloads that decode (same bytes, same order: A stays identical).
        Returns the number dropped."""
        total = torch.zeros_like(self.anchor)
        kept = 0
        for rank, data in enumerate(gathered):
            s, why = decode(data, self.state_spec, round_idx)
            if s is None:
                log.warning("noloco round %d: dropped rank %d's anchor payload: %s", round_idx, rank, why)
                continue
            total += decompress(s, self.state_spec).to(total.device)
            kept += 1
        if kept:
            self.anchor += total / kept
        return len(gathered) - kept

    def state_dict(self) -> dict[str, Any]:
        return {"ef": self.ef.state_dict(), "anchor": self.anchor.clone(), "dropped": self.dropped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ef.load_state_dict(state["ef"])
        anchor = state["anchor"]
        if tuple(anchor.shape) != tuple(self.anchor.shape):
            raise ValueError(
                f"compression anchor has shape {tuple(anchor.shape)}, the model needs {tuple(self.anchor.shape)}"
            )
        self.anchor.copy_(anchor.float())
        self.dropped = int(state["dropped"])


def compressed_outer_step(algo, group: tuple[int, ...], jumped: int) -> dict[str, float]:
    """NoLoCo's outer step with compressed messages (`algo` is the NoLoCo algorithm, γ = β)."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    gossip: CompressedGossip = algo.gossip
    transport, r = algo.transport, algo.round
    before = transport.stats.bytes_sent  # what this sync sends, as the transport counts it: one counter
    delta = _flatten_dense_tensors(algo.outer.pseudo_gradient(algo.params)).float()
    phi = _flatten_dense_tensors(algo.outer.slow)
    c_bytes, s_bytes, own = gossip.messages(delta, phi, r)
    pace = algo.pace_tensor(torch.device("cpu"))  # travels with the byte payloads
    received = None if jumped else transport.exchange([c_bytes, s_bytes, pace], group, r)
    decoded, paces, dropped = [], [], 0
    for i, theirs in enumerate(received or []):
        pair, why = gossip.decode_pair(theirs[0], theirs[1], r)
        if pair is None:
            dropped += 1
            log.warning(
                "noloco round %d: dropped partner %d's compressed payload: %s",
                r,
                [p for p in group if p != algo.world.rank][i],
                why,
            )
            decoded = []
            break
        decoded.append(pair)
        paces.append(theirs[2])
    gossip.dropped += dropped
    missed = received is None or dropped > 0  # the round mixes with nobody; e keeps what c did not carry
    direction = step_direction(gossip.learning_term([own, *decoded]), own.s, [d.s for d in decoded])
    algo.outer.step(_unflatten_dense_tensors(direction, algo.outer.slow))
    algo.outer.copy_to(algo.params)
    if algo.cfg.adaptive_inner_steps and paces:
        fastest = min(float(p[1]) for p in paces)
        if fastest < 1e30:
            algo.pace.hear(fastest)
    anchor_dropped = 0
    if gossip.reanchor_due(r):
        gathered = transport.all_gather_bytes(s_bytes.numpy().tobytes(), max_bytes=gossip.message_bytes[1])
        anchor_dropped = gossip.reanchor(gathered, r)
    sent = transport.stats.bytes_sent - before
    transport.publish(r + 1)
    st = transport.stats
    return {
        "outer/round": float(r + 1),
        "outer/partner_missed": float(missed),
        "outer/exchange_timeouts": float(st.timeouts),
        "outer/exchange_dropped": float(st.dropped),
        "outer/partner_skipped": float(st.partner_skipped),
        "outer/rounds_jumped": float(jumped),
        "outer/payload_bytes": float(c_bytes.numel() + s_bytes.numel()),
        "outer/bytes_sent": float(sent),
        "outer/payload_dropped": float(dropped + anchor_dropped),
        "outer/error_norm": gossip.ef.error.norm().item(),
        "outer/anchor_drift_norm": (phi - gossip.anchor).norm().item(),
    }
