"""engine=deepspeed: ZeRO-1/2 over the ranks of one replica (see core/mesh.py).

Optimizer state (and with stage 2 gradients) are sharded, parameters stay whole on every
rank, so the outer algorithms can average them as usual.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from filelock import FileLock  # a dependency of torch itself

from decentrain.algorithms.pretraining.engines.base import ENGINES, Engine, EngineConfig, build_optimizer
from decentrain.core.mesh import ReplicaLayout

ZERO_STAGES = (1, 2)
# DeepSpeed's CPU comm op (ShareMemCommBuilder.NAME, 0.15-0.19): torch JIT-builds it in <TORCH_EXTENSIONS_DIR>/<this>
COMM_OP = "deepspeed_shm_comm"


class _ReplicaMPU:
    """DeepSpeed's 'model parallel unit': data parallel = this replica's ranks, no model parallel."""

    def __init__(self, layout: ReplicaLayout, self_group: dist.ProcessGroup):
        self.layout, self.self_group = layout, self_group

    def get_data_parallel_group(self):
        return self.layout.shard_group

    def get_data_parallel_world_size(self) -> int:
        return self.layout.shards

    def get_data_parallel_rank(self) -> int:
        return self.layout.shard

    def get_model_parallel_group(self):
        return self.self_group

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def extension_build_lock(ext_dir: Path) -> FileLock:
    """Held while a decentrain process builds or loads a JIT op in `ext_dir`: an flock
    (filelock), which the kernel releases when its holder dies, so a killed rank never
    leaves it taken."""
    ext_dir.mkdir(parents=True, exist_ok=True)
    return FileLock(str(ext_dir / "decentrain-build.lock"))


def load_comm_op(ext_dir: Path) -> None:
    """Build (or load) DeepSpeed's CPU comm op before `deepspeed.initialize` does.

    torch's cpp_extension guards a JIT build with a lock *file* (FileBaton) that names no owner:
    a process killed mid-build (a preemption, a timeout) leaves it behind, and every later run
    on the machine waits on it forever, silently. Holding `extension_build_lock`, no decentrain
    process is building, so a lock file found there is stale and removed. One rank builds, the
    others then load its .so; initialize's own load returns the module this process already
    holds (OpBuilder caches loaded ops). A foreign process building into the same
    TORCH_EXTENSIONS_DIR without our lock is not covered; our default dir is our own.
    """
    from deepspeed.comm.torch import build_shm_op

    with extension_build_lock(ext_dir):
        with contextlib.suppress(FileNotFoundError):
            (ext_dir / COMM_OP / "lock").unlink()
        build_shm_op()  # None where the accelerator has no such op (CUDA): nothing to build


def _singleton_groups(world_size: int, rank: int) -> dist.ProcessGroup:
    # new_group is collective over the whole world: every rank creates every group, in order
    groups = [dist.new_group([r]) for r in range(world_size)]
    return groups[rank]


@dataclass
class DeepSpeedConfig(EngineConfig):
    name: str = "deepspeed"
    zero_stage: int = 2  # 1: optimizer state sharded, 2: gradients too (3 shards the weights: refused)


@ENGINES.register("deepspeed", config=DeepSpeedConfig)
class DeepSpeedEngine(Engine):
    """ZeRO-1/2 inside a replica. On CPU it runs over gloo with DeepSpeed's cpu accelerator."""

    @classmethod
    def check_config(cls, cfg: DeepSpeedConfig) -> None:
        super().check_config(cfg)
        if cfg.zero_stage == 3:
            raise ValueError(
                "engine.zero_stage=3 partitions the parameters themselves, which the outer "
                f"algorithms cannot average; allowed: {list(ZERO_STAGES)}"
            )
        if cfg.zero_stage not in ZERO_STAGES:
            raise ValueError(f"engine.zero_stage={cfg.zero_stage} is unknown; allowed: {list(ZERO_STAGES)}")
        if importlib.util.find_spec("deepspeed") is None:
            raise ValueError("engine.name='deepspeed' needs the deepspeed package (pip install deepspeed)")

    def __init__(self, cfg, optim, loop, layout, model, accum):
        super().__init__(cfg, optim, loop, layout, model, accum)
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # the first initialize JIT-builds a comm op (~40 s on CPU); cache it across runs
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/decentrain/torch_extensions"))
        import deepspeed

        load_comm_op(Path(os.environ["TORCH_EXTENSIONS_DIR"]))

        world_size = layout.replicas * layout.shards
        global_rank = layout.replica * layout.shards + layout.shard
        mpu = _ReplicaMPU(layout, _singleton_groups(world_size, global_rank)) if dist.is_initialized() else None
        # our own AdamW + LambdaLR (ZeRO supports torch.optim.AdamW): the same update and
        # schedule as engine=torch, and no fused-Adam build
        optimizer, scheduler = build_optimizer(model, optim, loop.steps, fused=False)
        ds_config = {
            "train_micro_batch_size_per_gpu": loop.micro_batch_size,
            "gradient_accumulation_steps": accum,
            "gradient_clipping": optim.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.ds, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=ds_config,
            mpu=mpu,
            dist_init_required=False,
        )
        self.forward_model = self.ds

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        # the loop owns accumulation: tell ZeRO which micro-batch reduces the gradients
        self.ds.set_gradient_accumulation_boundary(last)
        self.ds.backward(loss, scale_wrt_gas=False)

    def step(self) -> None:
        self.ds.step()  # clips, steps the ZeRO optimizer and the LR schedule, zeroes grads

    def weights_changed(self) -> None:
        # ZeRO keeps an fp32 master copy of this rank's partition; after an outer step the
        # module's parameters are the truth. An O(params) copy per step, cheap beside Adam.
        self.ds.optimizer.refresh_fp32_params()

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    # -- checkpoints: ZeRO's partitioned optimizer state through DeepSpeed's own checkpointing
    def _ds_dir(self) -> Path:
        if self.checkpoint_dir is None:
            raise ValueError("engine=deepspeed: no checkpoint directory was set")
        return self.checkpoint_dir / "deepspeed" / f"replica_{self.layout.replica}"

    def save_sharded(self, step: int) -> None:
        """Every rank writes its ZeRO partition (collective); one directory per replica, tag = step."""
        self._ds_dir().mkdir(parents=True, exist_ok=True)  # DeepSpeed makes it on global rank 0 only
        self.ds.save_checkpoint(str(self._ds_dir()), tag=f"step_{step:08d}", save_latest=False)
        if self.layout.shard == 0:
            tags = sorted(d for d in self._ds_dir().glob("step_*") if d.is_dir())
            for old in tags[: max(0, len(tags) - self.loop.keep_checkpoints)]:
                shutil.rmtree(old, ignore_errors=True)

    def state_dict(self) -> dict[str, Any]:
        # the module's weights are in the per-rank checkpoint; optimizer partitions in save_sharded's
        return {"engine": "deepspeed", "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("engine") != "deepspeed":
            raise ValueError(
                f"engine=deepspeed cannot resume a checkpoint of engine {state.get('engine', 'torch')!r}; "
                "use the same engine or a fresh run_dir"
            )
        tag = f"step_{int(state['step']):08d}"
        if not (self._ds_dir() / tag).is_dir():
            raise ValueError(
                f"engine=deepspeed: {self._ds_dir() / tag} is missing (a checkpoint from before ZeRO "
                "state was saved); use a fresh run_dir or resume=false"
            )
        self.ds.load_checkpoint(str(self._ds_dir()), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        self.scheduler.load_state_dict(state["scheduler"])
