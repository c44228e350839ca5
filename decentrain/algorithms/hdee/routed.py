"""HDEE experts merged into one routed causal LM (DUME, arXiv 2603.29765; IR3DE), experts frozen.

`RoutedExpertsForCausalLM` is a transformers `PreTrainedModel` with its own config
(`model_type = "decentrain_routed_experts"`). It holds a router backbone (the experts' common
seed), the frozen experts, and a ridge-regression router (`hdee.router`) fit in closed form on
the backbone's hidden states of a small calibration set, Y the one-hot of each text's domain.
Each token t is predicted by one expert, k_t = argmax_j (f_t W)_j, where f_t is the backbone's
hidden state at `router_layer` (pooling "token") or its causal running mean over positions <= t
("running_mean", a decision that settles as the sequence goes on). Routing is causal: f_t sees
x_<=t only, the token it predicts is x_t+1.

Saved with `save_pretrained` (safetensors: weights, router W and the per-class statistics) and
loaded with `RoutedExpertsForCausalLM.from_pretrained(path)`, or `AutoModelForCausalLM` /
`decentrain.models.factory.build_model(ModelConfig(pretrained=path))` once this module has been
imported (it registers the config and model with the Auto classes).

A routed config is data too: its sizes are measured (on the meta device) and capped before anything
is allocated, and `from_pretrained` refuses a checkpoint with a tensor missing, unexpected, of another
shape or non-finite (hdee/checkpoints.py); `merge` refuses experts of another vocabulary and
non-finite weights before the router is fit.

Departures from DUME, named: DUME upcycles dense experts into one MoE (shared attention, FFN
experts, a ridge router per layer, on the merged model's hidden states); here each expert stays a
whole model (no averaging of attention weights) and one router reads a fixed backbone (the seed),
so adding or removing an expert never changes the features the others were routed on. Top-1
routing only. `forward` runs every expert and keeps the routed logits (simple and exact);
`experts_run` counts what a KV-cached decoder would run: the distinct experts a sequence uses.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from decentrain.algorithms.hdee.checkpoints import (
    ROUTED_MODEL_TYPE,
    CheckpointError,
    check_finite,
    check_fits,
    check_keys,
    check_vocab,
    config_from_dict,
    model_bytes,
)
from decentrain.algorithms.hdee.router import RouterStats, fit_router, route
from decentrain.core.config_checks import check_range

log = logging.getLogger(__name__)
POOLINGS = ("token", "running_mean")
MAX_EXPERTS = 256  # before measuring each one's size: the list in config.json could be of any length
MAX_CLASSES = 1024  # router statistics kept per calibration class: a d x d float64 matrix each


class RoutedExpertsConfig(PretrainedConfig):
    model_type = ROUTED_MODEL_TYPE

    def __init__(
        self,
        backbone: dict | None = None,
        experts: list[dict] | None = None,
        expert_names: list[str] | None = None,
        calibration_classes: list[str] | None = None,
        router_layer: int = -1,
        pooling: str = "running_mean",
        ridge_lambda: float = 1.0,
        **kwargs,
    ):
        self.backbone = backbone or {}
        self.experts = list(experts or [])
        self.expert_names = list(expert_names or [])
        self.calibration_classes = list(calibration_classes or [])  # HᵀH's pool: may outlive removed experts
        self.router_layer = router_layer
        self.pooling = pooling
        self.ridge_lambda = ridge_lambda
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is unknown; allowed: {list(POOLINGS)}")
        if len(self.experts) != len(self.expert_names):
            raise ValueError(f"{len(self.experts)} expert configs but {len(self.expert_names)} expert_names")
        check_range("ridge_lambda", ridge_lambda, 0, None, low_open=True)
        if not isinstance(router_layer, int) or isinstance(router_layer, bool):
            raise ValueError(f"router_layer={router_layer!r} must be an integer")
        super().__init__(**kwargs)

    @property
    def hidden_size(self) -> int:
        return int(self.backbone.get("hidden_size", 0))


def _from_config(d: dict) -> PreTrainedModel:
    d = dict(d)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d))


def check_size(config: RoutedExpertsConfig, memory: int | None = None) -> None:
    """Before anything is allocated: the parts are causal LMs of the backbone's vocabulary, `router_layer`
    names a hidden state, and every tensor the config names fits in `memory` (default: this machine's)."""
    classes, k = len(config.calibration_classes), len(config.experts)
    if k > MAX_EXPERTS or classes > MAX_CLASSES:
        raise CheckpointError(
            f"routed config: {k} experts and {classes} calibration classes; at most {MAX_EXPERTS} and {MAX_CLASSES}"
        )
    backbone = config_from_dict(config.backbone, "routed config: backbone")
    total = model_bytes(backbone, "routed config: backbone")
    layers = backbone.num_hidden_layers
    if not -(layers + 1) <= config.router_layer <= layers:
        raise CheckpointError(
            f"routed config: router_layer={config.router_layer} names no hidden state of the backbone ({layers} layers)"
        )
    for i, part in enumerate(config.experts):
        expert = config_from_dict(part, f"routed config: experts[{i}]")
        check_vocab(expert, backbone.vocab_size, f"routed config: experts[{i}]")
        total += model_bytes(expert, f"routed config: experts[{i}]")
    d = backbone.hidden_size  # the router's buffers, float64: W [d, K], and per class G [d, d], s [d], n
    check_fits(total + 8 * (d * k + classes * (d * d + d + 1)), "routed config", memory)


def _config_dict(model: PreTrainedModel) -> dict:
    return model.config.to_diff_dict() | {"model_type": model.config.model_type}


class RoutedExpertsForCausalLM(PreTrainedModel):
    config_class = RoutedExpertsConfig
    base_model_prefix = "routed"
    _no_split_modules: list[str] = []

    def __init__(self, config: RoutedExpertsConfig):
        check_size(config)
        super().__init__(config)
        self.backbone = _from_config(config.backbone)
        self.experts = nn.ModuleList(_from_config(c) for c in config.experts)
        d, k, c = config.hidden_size, len(config.experts), len(config.calibration_classes)
        self.register_buffer("router_weight", torch.zeros(d, k, dtype=torch.float64))
        self.register_buffer("router_gram", torch.zeros(c, d, d, dtype=torch.float64))
        self.register_buffer("router_sums", torch.zeros(c, d, dtype=torch.float64))
        self.register_buffer("router_counts", torch.zeros(c, dtype=torch.float64))
        self.requires_grad_(False)  # experts and backbone stay frozen; the router is closed form
        self.post_init()

    def _init_weights(self, module) -> None:
        pass  # built from trained checkpoints (`merge`) or loaded (`from_pretrained`); never initialised here

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' loader (AutoModelForCausalLM and build_model come here too), refusing a checkpoint
        with a tensor missing (it would be left uninitialised), unexpected, of another shape, or non-finite."""
        asked = kwargs.pop("output_loading_info", False)
        kwargs.setdefault("ignore_mismatched_sizes", True)  # reported by name below, not as transformers' RuntimeError
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        where = f"routed model {pretrained_model_name_or_path}"
        check_keys(info, where)
        check_finite(model, where)
        return (model, info) if asked else model

    # -- the router's statistics, kept in buffers so they travel with save_pretrained ------------
    def stats(self) -> RouterStats:
        s = RouterStats()
        for i, name in enumerate(self.config.calibration_classes):
            s.gram[name], s.sums[name], s.counts[name] = (
                self.router_gram[i],
                self.router_sums[i],
                int(self.router_counts[i]),
            )
        return s

    def _set_stats(self, s: RouterStats) -> None:
        d = self.config.hidden_size
        self.config.calibration_classes = s.classes
        self.router_gram = (
            torch.stack([s.gram[c] for c in s.classes]) if s.classes else torch.zeros(0, d, d, dtype=torch.float64)
        )
        self.router_sums = (
            torch.stack([s.sums[c] for c in s.classes]) if s.classes else torch.zeros(0, d, dtype=torch.float64)
        )
        self.router_counts = torch.tensor([float(s.counts[c]) for c in s.classes], dtype=torch.float64)

    def recalibrate(self, calibration: dict[str, torch.Tensor], pooling: str | None = None) -> None:
        """Fit the router afresh (optionally for another pooling: its features differ) from calibration blocks."""
        if pooling is not None:
            if pooling not in POOLINGS:
                raise ValueError(f"pooling={pooling!r} is unknown; allowed: {list(POOLINGS)}")
            self.config.pooling = pooling
        self._set_stats(RouterStats())
        for name, blocks in calibration.items():
            self.calibrate(name, blocks)
        self.refit()

    def refit(self) -> None:
        """W for the current experts from the stored statistics: one d x d solve, no text read."""
        self.router_weight = fit_router(self.stats(), self.config.expert_names, self.config.ridge_lambda).to(
            self.router_weight.device
        )

    # -- features and routing -----------------------------------------------------------------
    @torch.no_grad()
    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, T, d] router features: the backbone's hidden state at `router_layer`, pooled causally."""
        h = self.backbone(input_ids=input_ids, output_hidden_states=True, use_cache=False).hidden_states[
            self.config.router_layer
        ]
        if self.config.pooling == "running_mean":
            h = h.cumsum(1) / torch.arange(1, h.shape[1] + 1, device=h.device, dtype=h.dtype)[None, :, None]
        return h

    def choices(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] index of the expert that predicts the token after each position."""
        return route(self.features(input_ids), self.router_weight)

    def experts_run(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B] distinct experts each sequence routes to: the experts a KV-cached decoder runs on it."""
        k = self.choices(input_ids)
        return torch.tensor([float(torch.unique(row).numel()) for row in k])

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        k = self.choices(input_ids)
        logits = torch.stack([e(input_ids=input_ids, use_cache=False).logits for e in self.experts])  # [K, B, T, V]
        idx = k[None, :, :, None].expand(1, *logits.shape[1:])
        out = logits.gather(0, idx).squeeze(0)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                out[:, :-1].reshape(-1, out.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutput(loss=loss, logits=out)

    # -- building, adding and removing experts ----------------------------------------------
    @torch.no_grad()
    def calibrate(self, name: str, blocks: torch.Tensor, batch_size: int = 16) -> None:
        """Accumulate class `name`'s statistics from its calibration token blocks [N, T] (once per class)."""
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        s = self.stats()
        if name in s.gram:
            raise ValueError(f"calibration class {name!r} already has statistics; remove it first")
        for b in blocks.split(batch_size):
            s.add(name, self.features(b.to(self.device)))
        self._set_stats(s)

    def add_expert(self, name: str, expert: PreTrainedModel, blocks: torch.Tensor | None = None) -> None:
        """Add a frozen expert; its calibration text (if its class is new) is the only text read."""
        if name in self.config.expert_names:
            raise ValueError(f"expert {name!r} is already in the routed model")
        check_vocab(expert.config, self.backbone.config.vocab_size, f"expert {name!r}")
        check_finite(expert, f"expert {name!r}")
        if name not in self.config.calibration_classes:
            if blocks is None:
                raise ValueError(f"expert {name!r} needs calibration blocks: its domain has no router statistics yet")
            self.calibrate(name, blocks)
        self.experts.append(expert.requires_grad_(False).eval())
        self.config.experts = [*self.config.experts, _config_dict(expert)]
        self.config.expert_names = [*self.config.expert_names, name]
        self.refit()

    def remove_expert(self, name: str, drop_calibration: bool = False) -> None:
        """Drop an expert and its router column; the other columns are unchanged unless
        `drop_calibration` also takes its text out of HᵀH (then: a refit on the remaining data)."""
        i = self.config.expert_names.index(name)
        del self.experts[i]
        self.config.experts = [c for j, c in enumerate(self.config.experts) if j != i]
        self.config.expert_names = [n for j, n in enumerate(self.config.expert_names) if j != i]
        if drop_calibration:
            s = self.stats()
            s.remove(name)
            self._set_stats(s)
            self.refit()
        else:
            self.router_weight = self.router_weight[
                :, [j for j in range(self.router_weight.shape[1]) if j != i]
            ].contiguous()


def merge(
    backbone: PreTrainedModel,
    experts: dict[str, PreTrainedModel],
    calibration: dict[str, torch.Tensor],
    ridge_lambda: float = 1.0,
    router_layer: int = -1,
    pooling: str = "running_mean",
    batch_size: int = 16,
) -> RoutedExpertsForCausalLM:
    """One routed model from a backbone and named experts, its router fit on `calibration`
    ({domain/expert name: token blocks}); classes without an expert stay in HᵀH's pool. Experts of
    another vocabulary than the backbone's, and non-finite weights anywhere, are refused first."""
    check_finite(backbone, "backbone")
    for name, expert in experts.items():
        check_vocab(expert.config, backbone.config.vocab_size, f"expert {name!r}")
        check_finite(expert, f"expert {name!r}")
    cfg = RoutedExpertsConfig(
        backbone=_config_dict(backbone),
        experts=[_config_dict(m) for m in experts.values()],
        expert_names=list(experts),
        router_layer=router_layer,
        pooling=pooling,
        ridge_lambda=ridge_lambda,
    )
    model = RoutedExpertsForCausalLM(cfg)
    model.backbone.load_state_dict(backbone.state_dict())
    for dst, src in zip(model.experts, experts.values()):
        dst.load_state_dict(src.state_dict())
    model.eval()
    for name, blocks in calibration.items():
        model.calibrate(name, blocks, batch_size)
    model.refit()
    log.info(
        f"[hdee] routed model: {len(experts)} experts, router {tuple(model.router_weight.shape)} "
        f"from {sum(int(c) for c in model.router_counts.tolist())} calibration tokens"
    )
    return model


AutoConfig.register(RoutedExpertsConfig.model_type, RoutedExpertsConfig)
AutoModelForCausalLM.register(RoutedExpertsConfig, RoutedExpertsForCausalLM)
