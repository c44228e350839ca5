"""The algorithm interface: hooks around one ordinary training loop.

Like torchft's DiLoCo, an algorithm never owns the loop. It may wrap the model (DDP),
act once at start (broadcast initial weights) and after each optimizer step (outer
syncs), and it carries its own state into checkpoints. New algorithms register a
config class and an implementation under a `name`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, ContextManager

import torch

from decentrain.core.registry import Registry
from decentrain.core.world import World


@dataclass
class AlgorithmConfig:
    name: str = "ddp"
    # keys this section no longer has -> the key that replaced them (relative to the section): a config
    # that still sets one fails in one line naming the new key
    RENAMED: ClassVar[dict[str, str]] = {}

    @classmethod
    def convert(cls, raw: Mapping[str, Any], where: str = "algorithm", default: "AlgorithmConfig | None" = None):
        """The section typed by its algorithm's own class (core/typed.py calls this for a registry-picked section)."""
        return ALGORITHMS.config(raw, where)


class Algorithm:
    config_cls: type[AlgorithmConfig] = AlgorithmConfig
    # True for gossip algorithms: the job goes on when a worker dies (launcher.launch_survivors);
    # collective ones stop together and recover by restart + exact resume
    survives_peer_loss: bool = False
    # True when the algorithm averages every step by wrapping the model (DDP): an engine that shards
    # inside a replica (Engine.shards_replica) does not apply that wrapper, so the two cannot combine
    syncs_every_step: bool = False

    def __init__(self, cfg: AlgorithmConfig, world: World):
        self.cfg = cfg
        self.world = world

    @classmethod
    def check_world(cls, cfg: AlgorithmConfig, world_size: int) -> None:
        """Refuse a world this algorithm cannot run on; called before any process group."""

    @classmethod
    def check_steps(cls, cfg: AlgorithmConfig, steps: int) -> None:
        """Refuse a run length this algorithm cannot finish cleanly; called before any process group."""

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def no_sync(self, model: torch.nn.Module) -> ContextManager:
        """Context for micro-batches that must not communicate (gradient accumulation)."""
        return contextlib.nullcontext()

    def attach_trainer_state(self, get: Callable[[], dict[str, Any]], load: Callable[[dict[str, Any]], None]) -> None:
        """How to read and load the trainer's whole state (weights, optimizer, schedule, sampler, this
        algorithm, step): what a live peer hands a replacement that heals from it."""
        self.trainer_state, self.load_trainer_state = get, load

    def on_train_start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    def on_resume(self, model: torch.nn.Module, backward_once: Callable[[], None]) -> None:
        """A resumed run, after wrapping and before its first step. `backward_once()` runs one
        synchronized forward/backward of a training micro-batch through `model` and drops the gradients."""

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, float]:
        """Runs after inner step `step` (1-based). Returns metrics to log."""
        return {}

    def drain(self, model: torch.nn.Module) -> dict[str, float]:
        """Apply every update still in flight (overlapped outer steps); called at the last step, before its
        evaluation and checkpoint, so that the final model holds every exchange. Returns metrics to log."""
        return {}

    def should_stop(self, step: int, total_steps: int) -> bool:
        """End the loop before `total_steps` (e.g. a worker paced to fewer inner steps per round)."""
        return False

    def on_train_end(self, model: torch.nn.Module) -> None:
        pass

    def bytes_sent(self) -> int | None:
        """Bytes this replica has put on the wire so far (cumulative, this process), or None if it
        cannot tell. The trainer logs it as `comm/bytes_sent`; a sync that reports its own
        `outer/bytes_sent` metric is counted from that instead."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


# each algorithm module registers its class with its own config class: ALGORITHMS.register("<name>", config=...)
ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", config=AlgorithmConfig)
