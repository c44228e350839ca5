"""SparseLoCo (arXiv 2508.15706): DiLoCo whose pseudo-gradient is sparse, 2-bit and error-fed.

Every H inner steps each replica folds its pseudo-gradient into its fp32 error buffer,
sends the top-k entries of each tile as b-bit codes (outer/compression.py has the
equations, outer/sparse_quantizers.py the quantisers), all-gathers everybody's payload
as bytes through the transport (over torch.distributed, core/comm/bytes_comm.py: sizes are
agreed first and capped at the one size an honest payload has, nothing is unpickled),
decodes them in rank order, averages each
index over the replicas that sent it (`algorithm.aggregation`: "mean_over_senders", the
reference code's rule; "sum_over_replicas", the paper's 1/R), and takes the outer step on
the slow weights.
Every replica sums the same decoded bytes in the same order, so the slow weights stay
identical on all replicas without any further collective.

A payload that fails decoding (wrong size, header, round, indices or scale) is dropped
and counted (`outer/payload_dropped`); the mean is over the payloads kept. Logged per
sync: `outer/payload_bytes` (this replica's message), `outer/bytes_sent` (what this rank
transmits, as its transport counts it: over gloo's ring all-gather every other rank's block once,
plus the 8-byte size announcements), `outer/error_norm` (‖e‖ after the send) and `outer/pseudo_grad_norm` (‖Δ̄‖).

The outer step defaults to SparseLoCo's: SGD with lr α and no momentum (the decayed EF
accumulator plays DiLoCo's outer momentum); `algorithm.outer_optimizer` turns it back on.

Defaults follow the reference code (templar `neurons.py` outer step, `compress.py`, hparams:
momentum_decay 0.95, topk_compression 64, target_chunk 64, quantization_bins 4, range 6σ,
outer_learning_rate 1.0): `tiling: tensor` (64×64 tiles per tensor), `quantizer: statistical`,
`aggregation: mean_over_senders`, β = 0.95, k = 64 per 4096-entry tile, 2 bits, α = 1. The
library's first choices stay as named options: `tiling: flat` (chunks of `chunk_size` over the
flat vector), `quantizer: maxabs`, `aggregation: sum_over_replicas` (the paper's 1/R).

`algorithm.rounds.mode` picks how a round closes (outer/rounds.py): `lockstep` (the all-gather above) or
`quorum` (outer/quorum.py). In quorum mode the payloads of a round not every replica made are read off
the board and averaged by the same aggregation, each decoded message scaled by its token weight (1.0,
untouched, when the tokens are equal); a message left out for good (late under `late: drop`) goes back
into its sender's error buffer, e ← e + D(c), so error feedback carries it to the next round.

Remaining departures from the reference, named: k scaled to tiles smaller than 64×64 and 1-D
tensors tiled like rows (outer/compression.py); uint16 indices, not 12-bit; no clipping of each
sender's values to the median norm over senders (templar's `batch_decompress(clip_norm=True)`,
a defence against outsized peers in its open network; a payload here is checked and counted
instead); no DCT (off in the reference's hparams too); payloads travel by all-gather, not
through object storage; every replica's payload is used (templar gathers a scored subset).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.outer.compression import (
    AGGREGATIONS,
    BITS,
    MAX_CHUNK,
    CompressionSpec,
    ErrorFeedback,
    SparseChunks,
    decompress,
    sent_mask,
)
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.algorithms.outer.quorum import RoundsConfig, rounds_config
from decentrain.algorithms.outer.rounds import RoundStrategy, build_rounds, check_rounds
from decentrain.algorithms.outer.sparse_payload import decode, encode, payload_bytes
from decentrain.algorithms.outer.sparse_quantizers import QUANTIZERS
from decentrain.algorithms.outer.updates import OuterOptimizer
from decentrain.algorithms.pretraining.inner_outer import InnerOuterAlgorithm, InnerOuterConfig
from decentrain.core.config_checks import check_range
from decentrain.core.registry import Registry

logger = logging.getLogger(__name__)


@dataclass
class SparseLoCoConfig(InnerOuterConfig):
    name: str = "sparseloco"
    inner_steps: int = 30  # H (the paper sweeps 15–100)
    # plain SGD at α = 1: the EF buffer replaces outer momentum (algorithm.outer_optimizer turns it back on)
    outer_optimizer: OuterOptimizerConfig = field(
        default_factory=lambda: OuterOptimizerConfig("sgd", lr=1.0, momentum=0.0)
    )  # sgd: no Nesterov at μ = 0
    ef_decay: float = 0.95  # β of e ← β·e + Δ
    tiling: str = "tensor"  # 64×64 tiles per tensor (reference), or "flat": chunks of chunk_size over all parameters
    tile_size: int = 64  # tile side (tiling: tensor)
    chunk_size: int = 4096  # C: entries per top-k chunk (tiling: flat)
    topk: int = 64  # k kept per full tile / chunk (64/4096 = 1.56 % density); smaller tiles keep the same share
    bits: int = 2  # b: value bits (2, 4 or 8)
    quantizer: str = "statistical"  # the reference's 6σ/4-bin quantiser, or "maxabs": one scale per tile
    aggregation: str = "mean_over_senders"  # or "sum_over_replicas" (the paper's 1/R); outer/compression.py
    # how a round closes: lockstep (every replica, an all-gather) or quorum (outer/quorum.py)
    rounds: RoundsConfig = field(default_factory=RoundsConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.adaptive_inner_steps:
            raise ValueError("algorithm.adaptive_inner_steps is not supported by sparseloco; allowed: false")
        self.rounds = rounds_config(self.rounds)
        check_rounds(self.rounds)
        check_range("algorithm.ef_decay", self.ef_decay, 0, 1)
        AGGREGATIONS.get(self.aggregation, field="algorithm.aggregation")
        TILINGS.get(self.tiling, field="algorithm.tiling")
        QUANTIZERS.get(self.quantizer, field="algorithm.quantizer")
        check_range("algorithm.tile_size", self.tile_size, 1, 256)
        check_range("algorithm.chunk_size", self.chunk_size, 1, MAX_CHUNK)
        check_range("algorithm.topk", self.topk, 1, self.chunk_size if self.tiling == "flat" else self.tile_size**2)
        if self.bits not in BITS:
            raise ValueError(f"algorithm.bits={self.bits} is unknown; allowed: {list(BITS)}")
        for f in ("tile_size", "chunk_size", "topk", "bits"):
            if not isinstance(getattr(self, f), int) or isinstance(getattr(self, f), bool):
                raise ValueError(f"algorithm.{f}={getattr(self, f)!r} must be an integer")


TILINGS: Registry = Registry("algorithm.tiling")  # name -> (config, parameter shapes) -> CompressionSpec


@TILINGS.register("tensor")
def _tensor_tiles(cfg: SparseLoCoConfig, shapes: list[torch.Size]) -> CompressionSpec:
    return CompressionSpec.tiled(shapes, cfg.topk, cfg.bits, cfg.quantizer, cfg.tile_size)


@TILINGS.register("flat")
def _flat_chunks(cfg: SparseLoCoConfig, shapes: list[torch.Size]) -> CompressionSpec:
    numel = sum(s.numel() for s in shapes)
    return CompressionSpec.flat(
        numel, min(cfg.chunk_size, numel), min(cfg.topk, cfg.chunk_size, numel), cfg.bits, cfg.quantizer
    )


@dataclass
class Message:
    chunks: SparseChunks  # what the error buffer gave up for this message
    data: bytes  # its wire bytes (outer/sparse_payload.py)


class SparsePayloads:
    """SparseLoCo's payload: the all-gather of every replica's message, or the messages a quorum round's
    record lists, read off the board; both decoded in order and averaged by `algorithm.aggregation`."""

    def __init__(self, algo: "SparseLoCo"):
        self.algo = algo

    def to_bytes(self, msg: Message) -> bytes:
        return msg.data

    def collective(self, msg: Message) -> tuple[torch.Tensor, dict[str, float]]:
        a = self.algo
        before = a.transport.stats.bytes_sent  # the transport counts what the all-gather sends: one counter
        gathered = a.transport.all_gather_bytes(msg.data, max_bytes=payload_bytes(a.spec))
        sent = a.transport.stats.bytes_sent - before
        mean, dropped = self._mean([(data, 1.0, a.round) for data in gathered])
        return mean, {
            "outer/payload_bytes": float(len(msg.data)),
            "outer/bytes_sent": float(sent),
            "outer/payload_dropped": float(dropped),
        }

    def merge(self, parts: list[tuple[bytes, float, int]]) -> tuple[torch.Tensor, dict[str, float]]:
        mean, dropped = self._mean(parts)
        return mean, {
            "outer/payload_bytes": float(payload_bytes(self.algo.spec)),
            "outer/payload_dropped": float(dropped),
        }

    def _mean(self, parts: list[tuple[bytes, float, int]]) -> tuple[torch.Tensor, int]:
        """Decode in order, scale, aggregate; a message that does not decode is dropped and counted."""
        a = self.algo
        device = a.outer.slow[0].device
        values, masks, dropped = [], [], 0
        for i, (data, scale, base) in enumerate(parts):
            chunks, why = decode(data, a.spec, base)
            if chunks is None:
                dropped += 1
                logger.warning("sparseloco round %d: dropped message %d (of round %d): %s", a.round, i, base, why)
                continue
            value = decompress(chunks, a.spec).to(device)
            values.append(value if scale == 1.0 else value * scale)
            masks.append(sent_mask(chunks, a.spec).to(device))
        a.dropped += dropped
        # our own message is always among them unless the wire broke it
        mean = a.aggregate(values, masks) if values else torch.zeros(a.spec.numel, dtype=torch.float32, device=device)
        return mean, dropped

    def left_out(self, msg: Message) -> None:
        self.algo.ef.error.add_(decompress(msg.chunks, self.algo.spec).to(self.algo.ef.error))  # e ← e + D(c)


@ALGORITHMS.register("sparseloco", config=SparseLoCoConfig)
class SparseLoCo(InnerOuterAlgorithm):
    cfg: SparseLoCoConfig

    def setup(self, model: torch.nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.outer = OuterOptimizer(self.params, self.cfg.outer_optimizer)
        self.spec = TILINGS.get(self.cfg.tiling)(self.cfg, [p.shape for p in self.params])
        numel = self.spec.numel
        self.ef = ErrorFeedback(self.spec, self.cfg.ef_decay, self.world.device)
        self.aggregate = AGGREGATIONS.get(self.cfg.aggregation)
        self.dropped = 0  # payloads dropped over the run
        self.sync: RoundStrategy = build_rounds(
            self.cfg.rounds, self.world.rank, self.world.world_size, self.transport, SparsePayloads(self)
        )
        self.sync.start()
        if self.world.is_main:
            logger.info(
                "sparseloco: %d parameters, %s tiling (%d tiles), %d kept, %d-bit %s: "
                "%d payload bytes vs %d dense fp32 (%.1fx)",
                numel,
                self.cfg.tiling,
                sum(g.n for g in self.spec.groups),
                self.spec.kept,
                self.spec.bits,
                self.cfg.quantizer,
                payload_bytes(self.spec),
                4 * numel,
                4 * numel / payload_bytes(self.spec),
            )

    @classmethod
    def check_world(cls, cfg: SparseLoCoConfig, world_size: int) -> None:
        cfg.rounds.check_world(world_size)

    def outer_step(self, model: torch.nn.Module) -> dict[str, float]:
        delta = _flatten_dense_tensors(self.outer.pseudo_gradient(self.params))
        chunks = self.ef.step(delta)
        synced = self.sync.exchange(
            Message(chunks, encode(chunks, self.spec, self.round)), self.inner_count, self.round
        )
        for mean in synced.updates:  # lockstep: one; quorum: every round closed since this replica's last sync
            self.outer.step(_unflatten_dense_tensors(mean, self.outer.slow))
        self.outer.copy_to(self.params)
        self.round += len(synced.updates) - 1  # the loop counts one
        norm = synced.updates[-1].norm().item() if synced.updates else 0.0
        return {
            "outer/pseudo_grad_norm": norm,
            "outer/error_norm": self.ef.error.norm().item(),
            **synced.metrics,
            "outer/round": float(self.round + 1),
        }

    def should_stop(self, step: int, total_steps: int) -> bool:
        return super().should_stop(step, total_steps) or self.sync.stops(self.round, total_steps, self.cfg.inner_steps)

    def drain(self, model: torch.nn.Module) -> dict[str, float]:
        synced = self.sync.drain(self.round)  # quorum rounds this replica has not applied yet (lockstep: none)
        for mean in synced.updates:
            self.outer.step(_unflatten_dense_tensors(mean, self.outer.slow))
        if synced.updates:
            self.outer.copy_to(self.params)
            self.round += len(synced.updates)
        return synced.metrics

    def on_train_end(self, model: torch.nn.Module) -> None:
        self.sync.finish()

    def outer_state(self) -> dict[str, Any]:
        return {"outer": self.outer.state_dict(), "ef": self.ef.state_dict(), "dropped": self.dropped}

    def load_outer_state(self, state: dict[str, Any]) -> None:
        self.outer.load_state_dict(state["outer"])
        self.ef.load_state_dict(state["ef"])
        self.dropped = int(state["dropped"])
