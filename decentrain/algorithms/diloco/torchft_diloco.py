"""DiLoCo and Streaming DiLoCo across replica groups that may die and come back: torchft's DiLoCo.

torchft's `local_sgd.DiLoCo` is optimizer-step hooks like ours, so it wraps the trainer's
own AdamW. Per sync (every H inner steps; Streaming: one fragment every H/P steps, in
turn) it takes a synchronous quorum τ steps before the outer step, where a group that is
behind heals from a live peer: the trainer's state (weights, AdamW, schedule, sampler
position, step) and, through torchft's fragment callbacks, each fragment's outer Nesterov
state and global weights. The pseudo-gradient mean goes over the participating groups;
if `should_commit()` fails (a group died mid-sync), the fragment is restored to its last
global weights and training goes on. Streaming's merge is torchft's
θ ← lerp(φ, θ_local, α), i.e. α·θ_local + (1−α)·φ, our `mix_alpha`.

Departures from decentrain's own Streaming DiLoCo (diloco/streaming.py), all torchft's
schedule: fragment f syncs at local steps ≡ (f+1)·H/P (ours: f·H/P) and fragments go in
turn by committed syncs; H must be a multiple of P and τ < H/P; payloads are fp32 (torchft's
quantised all-reduce is CUDA only).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from decentrain.algorithms.base import Algorithm
from decentrain.algorithms.diloco.diloco import DiLoCoConfig
from decentrain.algorithms.diloco.streaming import StreamingDiLoCoConfig
from decentrain.algorithms.outer.optimizers import OUTER_OPTIMIZERS
from decentrain.algorithms.outer.rounds import ROUND_MODES
from decentrain.algorithms.outer.updates import fragment_param_names
from decentrain.algorithms.pretraining.torchft.manager import FT_ALGORITHMS, ReplicaGroup, build_manager, ft_metrics
from decentrain.core.world import World

log = logging.getLogger(__name__)


class ParamFragment(nn.Module):
    """A module view of some of the model's parameters (the same Parameter objects), for torchft."""

    def __init__(self, named: list[tuple[str, nn.Parameter]]):
        super().__init__()
        self.params = nn.ParameterDict({n.replace(".", "/"): p for n, p in named})


def model_fragments(model: nn.Module, cfg: DiLoCoConfig | StreamingDiLoCoConfig) -> list[nn.Module]:
    if not isinstance(cfg, StreamingDiLoCoConfig) or cfg.num_fragments == 1:
        return [model]
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if cfg.fragments is not None:
        names = cfg.fragments
    else:
        layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
        if layers is None:
            raise ValueError("algorithm.fragments must list parameter names: the model has no config.num_hidden_layers")
        names = fragment_param_names(named, layers, cfg.num_fragments)
    return [ParamFragment([(n, named[n]) for n in frag]) for frag in names]


def global_sum(fragments) -> float:
    """fp64 sum of every fragment's global weights: replicas that hold bit-equal global state log the
    same value after each sync (the cheap check; two quorums of one, a split, make them differ for good)."""
    total = torch.zeros((), dtype=torch.float64)
    for f in fragments:
        for t in f.original_parameters.values():
            total += t.to(torch.float64).sum().cpu()
    return float(total)


def check_one_rank(cfg: DiLoCoConfig | StreamingDiLoCoConfig, world_size: int) -> None:
    """Both variants: one rank per replica group, and torchft's fixed H."""
    if world_size != 1:  # each rank of a group would be its own un-synced DiLoCo replica
        raise ValueError(
            f"launcher.nproc_per_node={world_size} with transport=torchft and algorithm={cfg.name}: "
            "allowed 1 (one rank per replica group; transport.replicas sets how many)"
        )
    if cfg.adaptive_inner_steps:
        raise ValueError("algorithm.adaptive_inner_steps=true with transport=torchft; allowed: false")


@FT_ALGORITHMS.register("diloco")
class TorchFTDiLoCo(Algorithm):
    cfg: DiLoCoConfig | StreamingDiLoCoConfig

    @classmethod
    def check_world(cls, cfg: DiLoCoConfig, world_size: int) -> None:
        """What torchft's DiLoCo cannot carry; `world_size`: the ranks of one replica group."""
        check_one_rank(cfg, world_size)
        if cfg.overlap:  # torchft's DiLoCo has its own schedule (streaming's overlap_steps)
            raise ValueError(
                "algorithm.overlap=true with transport=torchft; allowed: false "
                "(or algorithm=streaming_diloco with overlap_steps)"
            )
        if ROUND_MODES.get(cfg.rounds.mode).needs_board:  # torchft's Manager forms its own quorums
            raise ValueError(
                f"algorithm.rounds.mode={cfg.rounds.mode} runs on the transport's board, which torchft's "
                "replica groups do not use; allowed with transport=torchft: lockstep"
            )

    def __init__(self, cfg: DiLoCoConfig | StreamingDiLoCoConfig, world: World, group: ReplicaGroup, total_steps: int):
        super().__init__(cfg, world)
        self.group, self.total_steps = group, total_steps
        self.manager = None
        self.diloco = None
        self._resume: dict[str, Any] | None = None
        self.failed_syncs = 0
        self._summed_at, self._global_sum = -1, float("nan")

    def fragment_schedule(self) -> dict[str, Any]:
        """torchft DiLoCo's fragment arguments: one fragment, synced and merged at once."""
        return {"fragment_sync_delay": 0, "fragment_update_alpha": 0.0}

    def _heal_state(self) -> dict[str, Any]:
        # the fragments' outer state travels through torchft's own fragment callbacks: not twice
        return {**self.trainer_state(), "algorithm": {"local_step": self.diloco._local_step}}  # noqa: SLF001

    def on_train_start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        from torchft.local_sgd import DiLoCo

        self.manager = build_manager(self.world, self.group, self._heal_state, lambda s: self.load_trainer_state(s))
        fragments = model_fragments(model, self.cfg)
        rule = OUTER_OPTIMIZERS.get(self.cfg.outer_optimizer.name)  # torchft steps it on the pseudo-gradient
        outers = [rule.build(list(f.parameters()), self.cfg.outer_optimizer) for f in fragments]
        self.diloco = DiLoCo(
            self.manager, fragments, optimizer, outers, sync_every=self.cfg.inner_steps, **self.fragment_schedule()
        )
        if self._resume is not None:  # a whole-job restart from a checkpoint
            self._load(self._resume)
            self._resume = None
        self.diloco.__enter__()  # its optimizer-step hooks, on the trainer's AdamW
        inner_perform = [f.perform_sync for f in self.diloco._fragments]  # noqa: SLF001 -- count failed commits
        for frag, perform in zip(self.diloco._fragments, inner_perform):  # noqa: SLF001
            frag.perform_sync = self._counted(perform)

    def _counted(self, perform):
        def perform_sync() -> bool:
            ok = perform()
            if not ok:
                self.failed_syncs += 1
                log.warning("sync not committed: the fragment is back at its last global weights; training goes on")
            return ok

        return perform_sync

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        metrics = {**ft_metrics(self.manager), "ft/failed_syncs": float(self.failed_syncs)}
        committed = self.manager.current_step()
        if committed != self._summed_at:  # once per committed sync: a split quorum shows as unequal sums
            self._summed_at = committed
            self._global_sum = global_sum(self.diloco._fragments)  # noqa: SLF001
        return {**metrics, "ft/global_sum": self._global_sum}

    def on_train_end(self, model: torch.nn.Module) -> None:
        self.diloco.__exit__(None, None, None)
        self.manager.shutdown(wait=False)

    # checkpoints (whole-job restarts): torchft's step, the local step and each fragment's outer state
    def state_dict(self) -> dict[str, Any]:
        if self.diloco is None:
            return self._resume or {}
        frags = self.diloco._fragments  # noqa: SLF001 -- torchft keeps the fragments' global weights there
        return {
            "torchft": self.manager.state_dict(),
            "local_step": self.diloco._local_step,  # noqa: SLF001
            "fragments": [
                {"outer": f._outer_optimizer.state_dict(), "global": dict(f.original_parameters)} for f in frags
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.diloco is None:
            self._resume = state
        else:
            self._load(state)

    def _load(self, state: dict[str, Any]) -> None:
        self.diloco._local_step = int(state["local_step"])  # noqa: SLF001
        if "torchft" in state:
            self.manager.load_state_dict(state["torchft"])
        for f, s in zip(self.diloco._fragments, state.get("fragments", []), strict=False):  # noqa: SLF001
            f._outer_optimizer.load_state_dict(s["outer"])  # noqa: SLF001
            for name, t in s["global"].items():
                f.original_parameters[name].copy_(t)


@FT_ALGORITHMS.register("streaming_diloco")
class TorchFTStreamingDiLoCo(TorchFTDiLoCo):
    """torchft's schedule for fragments: fragment f syncs at local steps ≡ (f+1)·H/P, quorum τ steps before."""

    cfg: StreamingDiLoCoConfig

    @classmethod
    def check_world(cls, cfg: StreamingDiLoCoConfig, world_size: int) -> None:
        check_one_rank(cfg, world_size)
        h, p, tau = cfg.inner_steps, cfg.num_fragments, cfg.overlap_steps
        if h % p:
            raise ValueError(
                f"algorithm.inner_steps={h} must be a multiple of algorithm.num_fragments={p} with transport=torchft"
            )
        if tau >= h // p:
            raise ValueError(
                f"algorithm.overlap_steps={tau} must be < inner_steps/num_fragments={h // p} with transport=torchft"
            )
        if cfg.quantization != "none":
            raise ValueError(f"algorithm.quantization={cfg.quantization!r} with transport=torchft; allowed: none")

    def fragment_schedule(self) -> dict[str, Any]:
        return {"fragment_sync_delay": self.cfg.overlap_steps, "fragment_update_alpha": self.cfg.mix_alpha}
