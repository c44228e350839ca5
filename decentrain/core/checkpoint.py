"""Atomic, per-rank checkpoints: safetensors for tensors, JSON for everything else.

Layout: `<root>/step_00000100/rank_3/{tensors.safetensors,state.json}`. Each rank writes
into a temp dir and renames it into place, so a crash mid-save leaves the previous
checkpoint untouched and at worst a `.tmp-*` dir that the next save removes. A step
counts as complete when every rank's dir is there; ranks never wait on each other, so
saving adds no barrier (NoLoCo allows none after start-up).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

_STEP = re.compile(r"^step_(\d+)$")
_TENSOR = "__tensor__"


def flatten_state(state: Any, tensors: dict[str, torch.Tensor], prefix: str = "") -> Any:
    """Move every tensor of a nested dict/list into `tensors`; return the JSON-able rest."""
    if isinstance(state, torch.Tensor):
        key = prefix or "_"
        tensors[key] = state.detach().cpu().contiguous().clone()
        return {_TENSOR: key}
    if isinstance(state, dict):
        out = {}
        for k, v in state.items():
            out[str(k)] = flatten_state(v, tensors, f"{prefix}.{k}" if prefix else str(k))
        # torch optimizers key their state by int param index; keep that type
        if state and all(isinstance(k, int) for k in state):
            out["__int_keys__"] = True
        return out
    if isinstance(state, (list, tuple)):
        return [flatten_state(v, tensors, f"{prefix}.{i}") for i, v in enumerate(state)]
    return state


def unflatten_state(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            return tensors[obj[_TENSOR]]
        int_keys = obj.pop("__int_keys__", False)
        out = {(int(k) if int_keys else k): unflatten_state(v, tensors) for k, v in obj.items()}
        return out
    if isinstance(obj, list):
        return [unflatten_state(v, tensors) for v in obj]
    return obj


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    def __init__(self, root: str | os.PathLike, rank: int, world_size: int, keep: int = 2):
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.keep = keep

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write this rank's `state` (nested dicts of tensors and JSON values) for `step`."""
        step_dir = self.step_dir(step)
        step_dir.mkdir(parents=True, exist_ok=True)
        final = step_dir / f"rank_{self.rank}"
        for stale in step_dir.glob(f".tmp-rank_{self.rank}-*"):  # left by a crashed save
            shutil.rmtree(stale, ignore_errors=True)
        tmp = step_dir / f".tmp-rank_{self.rank}-{os.getpid()}"
        tmp.mkdir()
        tensors: dict[str, torch.Tensor] = {}
        meta = flatten_state(state, tensors)
        save_file(tensors, str(tmp / "tensors.safetensors"))
        with open(tmp / "state.json", "w") as f:
            json.dump({"step": step, "world_size": self.world_size, "state": meta}, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step (e.g. after a resume) replaces it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(step_dir)
        self._prune()
        return final

    def complete_steps(self) -> list[int]:
        steps = []
        if not self.root.is_dir():
            return steps
        for d in self.root.iterdir():
            m = _STEP.match(d.name)
            if m and all((d / f"rank_{r}" / "state.json").exists() for r in range(self.world_size)):
                steps.append(int(m.group(1)))
        return sorted(steps)

    def latest(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def load(self, step: int, rank: int | None = None) -> dict[str, Any]:
        d = self.step_dir(step) / f"rank_{self.rank if rank is None else rank}"
        with open(d / "state.json") as f:
            meta = json.load(f)
        if meta["world_size"] != self.world_size:
            raise ValueError(f"checkpoint {d} was written by world_size={meta['world_size']}, this run has {self.world_size}")
        return unflatten_state(meta["state"], load_file(str(d / "tensors.safetensors")))

    def _prune(self) -> None:
        # each rank removes only its own dirs older than the `keep` newest complete steps
        complete = self.complete_steps()
        if len(complete) <= self.keep:
            return
        cutoff = complete[-self.keep]
        for d in self.root.iterdir():
            m = _STEP.match(d.name)
            if not m or int(m.group(1)) >= cutoff:
                continue
            shutil.rmtree(d / f"rank_{self.rank}", ignore_errors=True)
            for tmp in d.glob(f".tmp-rank_{self.rank}-*"):
                shutil.rmtree(tmp, ignore_errors=True)
            try:
                d.rmdir()  # the last rank out removes the step dir
            except OSError:
                pass
