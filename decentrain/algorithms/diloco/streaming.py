"""Streaming DiLoCo (arXiv 2501.18512): fragments sync in turn, overlapped with compute.

Parameters split into P strided layer fragments. Fragment p sends its pseudo-gradient
at the inner steps t with t ≡ p·H/P (mod H), so the syncs spread over the round. Each
payload holds ~1/P of the layers, but the fragments of the first and last layer also
carry the embeddings and the final norm / head, so they are larger (the sizes are
logged at start-up; `algorithm.fragments` sets an explicit split). The collective runs
in the background for τ inner steps; then the fragment's outer step
(`algorithm.outer_optimizer`) lands and the local weights, which moved on during
those τ steps, are merged: θ ← α·θ + (1−α)·φ. The payload may be fp16 or int4, always
accumulated in fp32.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from decentrain.algorithms.base import ALGORITHMS
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.algorithms.outer.quantized_mean import QUANTIZATIONS, check_quantization_backend, codec_for
from decentrain.algorithms.outer.updates import OuterOptimizer, check_fragments_cover, fragment_param_names, mix_
from decentrain.algorithms.pretraining.inner_outer import InnerOuterAlgorithm, InnerOuterConfig

logger = logging.getLogger(__name__)


@dataclass
class StreamingDiLoCoConfig(InnerOuterConfig):
    name: str = "streaming_diloco"
    inner_steps: int = 100  # H: each fragment syncs once every H inner steps
    # sgd: Nesterov at μ > 0
    outer_optimizer: OuterOptimizerConfig = field(default_factory=lambda: OuterOptimizerConfig("sgd", 0.7, 0.9))
    num_fragments: int = 4  # P, strided over layers
    overlap_steps: int = 1  # τ: inner steps between a fragment's send and its update
    mix_alpha: float = 0.5  # α: share of the local weights kept at the merge
    quantization: str = "none"  # none | fp16 | int4
    quant_chunk: int = 128
    fragments: list[list[str]] | None = None  # explicit parameter names per fragment (non-HF models)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.adaptive_inner_steps:
            raise ValueError("algorithm.adaptive_inner_steps is not supported by streaming_diloco; allowed: false")
        if self.num_fragments < 1:
            raise ValueError(f"algorithm.num_fragments={self.num_fragments} must be >= 1")
        if self.num_fragments > self.inner_steps:
            raise ValueError(
                f"algorithm.num_fragments={self.num_fragments} must be <= algorithm.inner_steps={self.inner_steps}"
            )
        if not 0 <= self.overlap_steps < self.inner_steps:
            raise ValueError(
                f"algorithm.overlap_steps={self.overlap_steps} (τ) must be in [0, inner_steps={self.inner_steps})"
            )
        if not 0 <= self.mix_alpha <= 1:
            raise ValueError(f"algorithm.mix_alpha={self.mix_alpha} must be in [0, 1]")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"algorithm.quantization={self.quantization!r} is unknown; allowed: {list(QUANTIZATIONS)}")
        if self.fragments is not None and len(self.fragments) != self.num_fragments:
            raise ValueError(
                f"algorithm.fragments has {len(self.fragments)} lists; algorithm.num_fragments={self.num_fragments}"
            )


@ALGORITHMS.register("streaming_diloco", config=StreamingDiLoCoConfig)
class StreamingDiLoCo(InnerOuterAlgorithm):
    cfg: StreamingDiLoCoConfig

    def setup(self, model: torch.nn.Module) -> None:
        check_quantization_backend(self.cfg.quantization, self.world.backend)
        named = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if self.cfg.fragments is not None:
            try:
                check_fragments_cover(self.cfg.fragments, named)
            except ValueError as e:
                raise ValueError(f"algorithm.fragments: {e}") from None
            names = self.cfg.fragments
        else:
            layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
            if layers is None:
                raise ValueError(
                    "algorithm.fragments must list parameter names: the model has no config.num_hidden_layers"
                )
            try:
                names = fragment_param_names(named, layers, self.cfg.num_fragments)
            except ValueError as e:
                raise ValueError(f"algorithm.num_fragments={self.cfg.num_fragments}: {e}") from None
        self.frag_params = [[named[n] for n in frag] for frag in names]
        self.fragment_numels = [sum(p.numel() for p in ps) for ps in self.frag_params]
        logger.info("streaming_diloco fragments (parameters each): %s", self.fragment_numels)
        self.outers = [OuterOptimizer(ps, self.cfg.outer_optimizer) for ps in self.frag_params]  # one per fragment
        h, p = self.cfg.inner_steps, self.cfg.num_fragments
        self.offsets = [f * h // p for f in range(p)]
        self.pending: list[dict[str, Any]] = []  # {"frag", "due", "mean": PendingMean | list[Tensor]}

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for f, off in enumerate(self.offsets):
            if step % self.cfg.inner_steps == off:
                delta = self.outers[f].pseudo_gradient(self.frag_params[f])
                mean = self.transport.start_mean(delta, codec_for(self.cfg.quantization, self.cfg.quant_chunk))
                metrics["outer/payload_bytes"] = metrics.get("outer/payload_bytes", 0.0) + mean.payload_bytes
                self.pending.append({"frag": f, "due": step + self.cfg.overlap_steps, "mean": mean})
                self.round += 1
        for item in [it for it in self.pending if it["due"] <= step]:
            self._apply(item)
            metrics[f"outer/fragment_{item['frag']}"] = float(step)
        return metrics

    def _apply(self, item: dict[str, Any]) -> None:
        f = item["frag"]
        self.outers[f].step(self._result(item))
        mix_(self.frag_params[f], self.outers[f].slow, self.cfg.mix_alpha)
        self.pending.remove(item)

    @staticmethod
    def _result(item: dict[str, Any]) -> list[torch.Tensor]:
        if not isinstance(item["mean"], list):
            item["mean"] = item["mean"].result()
        return item["mean"]

    def on_train_end(self, model: torch.nn.Module) -> None:
        for item in list(self.pending):  # never leave a collective in flight
            self._apply(item)

    def outer_state(self) -> dict[str, Any]:
        # In-flight means are waited for and saved as tensors: resume applies them at the same step.
        pending = [{"frag": it["frag"], "due": it["due"], "mean": self._result(it)} for it in self.pending]
        return {"fragments": [o.state_dict() for o in self.outers], "pending": pending}

    def load_outer_state(self, state: dict[str, Any]) -> None:
        for o, s in zip(self.outers, state["fragments"], strict=True):
            o.load_state_dict(s)
        self.pending = [
            {"frag": int(it["frag"]), "due": int(it["due"]), "mean": list(it["mean"])} for it in state["pending"]
        ]
