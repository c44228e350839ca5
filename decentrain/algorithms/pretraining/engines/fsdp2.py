"""FSDP2 (`torch.distributed.fsdp.fully_shard`) inside each replica, with DCP checkpoints.

A replica is `shards_per_replica` ranks (core/mesh.py). Each transformer block and then the
root are sharded over the replica's "shard" mesh dimension: parameters, gradients and
AdamW state are split by dim 0, so a replica can be larger than one GPU. The outer
algorithm (DiLoCo, NoLoCo) sees one rank per replica: on shard rank s it averages the
local shards with the shard-s ranks of the other replicas (the "replica" group), which
is the same element-wise update the whole tensors would get, since every replica shards
the same model the same way.

Checkpoints: model and optimizer go through torch.distributed.checkpoint (one DCP
directory per replica, written collectively by its shard ranks); the per-rank
Checkpointer keeps the rest (sampler, RNG, the outer state of this rank's shards).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from decentrain.algorithms.pretraining.engines.base import ENGINES
from decentrain.algorithms.pretraining.engines.torch import TorchEngine
from decentrain.algorithms.pretraining.precision import resolve_precision, transformer_blocks


class LocalShards:
    """The outer algorithm's view of a sharded replica: this rank's shard of every parameter.

    Each entry aliases FSDP's sharded storage (no copy), so an outer step that writes the
    parameters in place (`copy_`) moves the shards the inner optimizer trains. Names are
    the model's own, so Streaming DiLoCo's layer fragments and the replica fingerprint work.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.config = getattr(model, "config", None)

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self.model.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            yield name, torch.nn.Parameter(local.detach(), requires_grad=p.requires_grad)  # shares the storage

    def parameters(self) -> Iterator[torch.Tensor]:
        for _, p in self.named_parameters():
            yield p

    def buffers(self) -> Iterator[torch.Tensor]:
        return self.model.buffers()  # FSDP2 leaves buffers whole on every rank


@ENGINES.register("fsdp2")
class FSDP2Engine(TorchEngine):
    """fully_shard per block and at the root over the replica's shard ranks; AdamW on the shards.

    The step, schedule and LR are TorchEngine's: on DTensor gradients clip_grad_norm_ reduces the
    norm over the shard group, as with whole tensors."""

    whole_model_state = False  # model and optimizer go to DCP (save_sharded)
    min_shards, max_shards = 2, None  # one rank per replica: use engine=torch
    shards_replica = True

    def __init__(self, cfg, optim, loop, layout, model, accum):
        if layout.mesh is None:
            raise ValueError("engine=fsdp2 needs engine.shards_per_replica >= 2 ranks per replica")
        mesh = layout.mesh["shard"]
        device = next(model.parameters()).device
        # bf16 autocast: FSDP's own mixed precision (bf16 gathers and compute, fp32 master
        # shards and fp32 gradient reduction), the usual FSDP2 setup
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if resolve_precision(loop.precision, device) == "bf16_autocast"
            else MixedPrecisionPolicy()
        )
        blocks = transformer_blocks(model)
        for i, block in enumerate(blocks):
            # the last block is gathered again at once by the backward: keep it unsharded
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        super().__init__(cfg, optim, loop, layout, model, accum)  # the optimizer is built on the shards
        self.checkpoint_dir: Path | None = None  # set by the Trainer
        self.keep = loop.keep_checkpoints

    @property
    def outer_model(self) -> LocalShards:
        return LocalShards(self.model)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        # reduce-scatter the gradients only after the last micro-batch
        self.model.set_requires_gradient_sync(last)
        loss.backward()

    # -- checkpoints ------------------------------------------------------------------
    def _dcp_dir(self, step: int) -> Path:
        if self.checkpoint_dir is None:
            raise ValueError("engine=fsdp2: no checkpoint directory was set")
        return self.checkpoint_dir / "dcp" / f"step_{step:08d}" / f"replica_{self.layout.replica}"

    def save_sharded(self, step: int) -> None:
        """Model + optimizer of this replica, written by its shard ranks together (DCP)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save(
            {"model": model_sd, "optimizer": optim_sd},
            checkpoint_id=str(self._dcp_dir(step)),
            process_group=self.layout.shard_group,
        )
        if self.layout.shard == 0:
            self._prune(step)

    def _prune(self, newest: int) -> None:
        root = self.checkpoint_dir / "dcp"
        steps = sorted(
            int(d.name.split("_")[1]) for d in root.glob("step_*") if (d / f"replica_{self.layout.replica}").is_dir()
        )
        for old in [s for s in steps if s < newest][: max(0, len(steps) - self.keep)]:
            shutil.rmtree(root / f"step_{old:08d}" / f"replica_{self.layout.replica}", ignore_errors=True)
            try:
                (root / f"step_{old:08d}").rmdir()  # the last replica out removes the step
            except OSError:
                pass

    def state_dict(self) -> dict[str, Any]:
        # model and optimizer live in the DCP directory of the same step (save_sharded)
        return {"engine": "fsdp2", "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("engine") != "fsdp2":
            raise ValueError(
                f"engine=fsdp2 cannot resume a checkpoint of engine {state.get('engine', 'torch')!r}; "
                "use the same engine or a fresh run_dir"
            )
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        loaded = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(loaded, checkpoint_id=str(self._dcp_dir(int(state["step"]))), process_group=self.layout.shard_group)
        set_state_dict(
            self.model, self.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"]
        )
        self.scheduler.load_state_dict(state["scheduler"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Whole, host-side weights for save_pretrained; collective over the replica's shard ranks."""
        group = self.layout.shard_group
        if dist.get_backend(group) == "gloo" and next(self.model.parameters()).device.type == "cuda":
            return gather_on_host(self.model, group)
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def gather_on_host(model: torch.nn.Module, group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    """The whole state dict of a dim-0-sharded model, gathered through host memory.

    Why by hand: ranks that share one GPU talk over gloo, and there DTensor's own gather
    (`full_tensor`, `get_model_state_dict(full_state_dict=True)`) segfaults every rank on CUDA
    tensors (torch 2.11 + CUDA 13 on an H200, tests/gpu/test_recipes_cuda.py); gloo's
    all_gather of host tensors does not. FSDP2 shards dim 0 as torch.chunk does (every shard
    but the last ones holds ceil(n / ranks) rows), so padded pieces concatenate in order."""
    ranks = dist.get_world_size(group)
    whole = {}
    for name, value in model.state_dict().items():
        if not isinstance(value, DTensor):
            whole[name] = value.detach().cpu()
            continue
        local = value.to_local().detach().cpu()
        rows = -(-value.shape[0] // ranks)
        piece = local.new_zeros((rows, *value.shape[1:]))
        piece[: local.shape[0]] = local
        pieces = [torch.empty_like(piece) for _ in range(ranks)]
        dist.all_gather(pieces, piece, group=group)
        whole[name] = torch.cat(pieces)[: value.shape[0]]
    return whole
