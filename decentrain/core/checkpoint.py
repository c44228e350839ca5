"""Atomic, per-rank checkpoints: safetensors for tensors, JSON for everything else.

Layout: `<root>/step_00000100/rank_3/{tensors.safetensors,state.json}`. Each rank writes
into a temp dir and renames it into place, so a crash mid-save leaves the previous
checkpoint untouched and at worst a `.tmp-*` dir that the next save removes. A step
counts as complete when every rank's dir is there; ranks never wait on each other, so
saving adds no barrier (NoLoCo allows none after start-up).

Each rank dir also holds `checksums.json` (sha256 of both files, written last). Loading
verifies it, so a truncated, emptied or bit-flipped file is named in a one-line warning
and the resume falls back to the newest step that is good on every rank
(`agree_resume_step`, one all-reduce at start-up).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load, save_file

from decentrain.core.world import World

log = logging.getLogger(__name__)

_STEP = re.compile(r"^step_(\d+)$")
_TENSOR = "__tensor__"
_FILES = ("tensors.safetensors", "state.json")
_SUMS = "checksums.json"


class CheckpointError(ValueError):
    """A rank's checkpoint files are missing, damaged or inconsistent (the message names the file)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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
        with open(tmp / _SUMS, "w") as f:  # read back: the hash covers what reached the disk
            json.dump({"step": step, "sha256": {name: _sha256(tmp / name) for name in _FILES}}, f)
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
        """This rank's state at `step`, verified; raises CheckpointError naming the bad file."""
        d = self.step_dir(step) / f"rank_{self.rank if rank is None else rank}"
        blobs = {}
        for name in _FILES:
            try:
                blobs[name] = (d / name).read_bytes()
            except OSError as e:
                raise CheckpointError(f"{d / name}: unreadable ({e.strerror or e})") from None
        sums_file = d / _SUMS
        # A missing checksum file is damage too: deleting it must not turn verification off.
        try:
            sums = json.loads(sums_file.read_text())["sha256"]
        except FileNotFoundError:
            raise CheckpointError(f"{sums_file}: missing (every step is written with one)") from None
        except (ValueError, KeyError, TypeError, OSError):
            raise CheckpointError(f"{sums_file}: damaged checksum file") from None
        if not isinstance(sums, dict):
            raise CheckpointError(f"{sums_file}: damaged checksum file")
        for name, blob in blobs.items():
            if hashlib.sha256(blob).hexdigest() != sums.get(name):
                raise CheckpointError(f"{d / name}: sha256 differs from {_SUMS} (truncated or corrupted)")
        try:
            meta = json.loads(blobs["state.json"])
            world_size, state = meta["world_size"], meta["state"]
        except (ValueError, KeyError, TypeError):
            raise CheckpointError(f"{d / 'state.json'}: not a checkpoint state (empty, truncated or garbage)") from None
        try:
            tensors = load(blobs["tensors.safetensors"])
        except Exception:  # safetensors raises its own SafetensorError (and others) on a bad header
            raise CheckpointError(f"{d / 'tensors.safetensors'}: not a safetensors file (empty, truncated or garbage)") from None
        if world_size != self.world_size:
            raise ValueError(f"checkpoint {d} was written by world_size={world_size}, this run has {self.world_size}")
        try:
            return unflatten_state(state, tensors)
        except (KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{d / 'state.json'}: refers to tensors that {d / 'tensors.safetensors'} lacks") from None

    def good_steps(self) -> list[int]:
        """Complete steps whose files verify for this rank, oldest first; each bad one gets a one-line warning."""
        good = []
        for step in self.complete_steps():
            try:
                self.load(step)
            except CheckpointError as e:
                log.warning("rank %d: skipping checkpoint step %d: %s", self.rank, step, e)
                continue
            good.append(step)
        return good

    def newest_good_step(self) -> int | None:
        """This rank's newest step that verifies, on its own (jobs whose ranks need not agree)."""
        good = self.good_steps()
        return good[-1] if good else None

    def own_steps(self) -> list[int]:
        """Steps for which this rank's own dir exists, complete or not."""
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for d in self.root.iterdir() if (m := _STEP.match(d.name)) and (d / f"rank_{self.rank}").is_dir())

    def agree_resume_step(self, world: World) -> int | None:
        """The newest step good on every rank (None: start afresh everywhere).

        One MIN all-reduce per attempt, start-up only. A run whose ranks see different
        checkpoints (node-local disks) stops with a clear error instead of quietly
        restarting from step 0 on some ranks.
        """
        if not world.is_distributed:
            return self.newest_good_step()
        good = self.good_steps()

        def lowest(value: int) -> int:
            t = torch.tensor([value], dtype=torch.int64, device=world.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=world.group)
            return int(t.item())

        candidate = good[-1] if good else -1
        while True:
            agreed = lowest(candidate)
            if agreed < 0:
                break
            mine = max((s for s in good if s <= agreed), default=-1)
            if lowest(int(mine == agreed)) == 1:
                return agreed
            candidate = mine
        seen = self.own_steps()
        if -lowest(-(seen[-1] if seen else -1)) >= 0:  # some rank has its own files, yet no step is good on all
            raise RuntimeError(
                f"no checkpoint step is complete and intact on every rank, but some rank has step dirs under {self.root} "
                f"(this rank sees {seen or 'none'}): checkpoints must live on storage that all ranks share. "
                "Point run_dir at shared storage, or set resume=false to start afresh")
        return None

    def _prune(self) -> None:
        # every rank may remove whole steps older than the `keep` newest complete ones: no rank
        # writes there any more, and leaving other ranks' dirs behind left incomplete steps
        complete = self.complete_steps()
        if len(complete) <= self.keep:
            return
        cutoff = complete[-self.keep]
        for d in self.root.iterdir():
            m = _STEP.match(d.name)
            if m and int(m.group(1)) < cutoff:
                shutil.rmtree(d, ignore_errors=True)
