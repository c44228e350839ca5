"""engine=torch: AdamW + LambdaLR on every rank; gradients averaged by the algorithm's wrapper (e.g. DDP)."""

from __future__ import annotations

from typing import Any

import torch

from decentrain.algorithms.base import Algorithm
from decentrain.algorithms.pretraining.engines.base import ENGINES, Engine, build_optimizer


@ENGINES.register("torch")
class TorchEngine(Engine):
    max_shards = 1  # one rank per replica: nothing to shard
    shards_replica = False

    def __init__(self, cfg, optim, loop, layout, model, accum):
        super().__init__(cfg, optim, loop, layout, model, accum)
        self.optimizer, self.scheduler = build_optimizer(model, optim, loop.steps)
        self.forward_model = model

    def prepare(self, algorithm: Algorithm) -> None:
        self.forward_model = algorithm.wrap_model(self.model)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self) -> None:
        if self.optim_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
