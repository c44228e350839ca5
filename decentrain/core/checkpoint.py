"""Atomic, per-rank checkpoints: safetensors for tensors, JSON for everything else.

Layout: `<root>/step_00000100/rank_3/{tensors.safetensors,state.json}`. Each rank writes
into a temp dir and renames it into place, so a crash mid-save leaves the previous
checkpoint untouched and at worst a `.tmp-*` dir that the next save removes. A step
counts as complete when every rank's dir is there; ranks never wait on each other, so
saving adds no barrier (NoLoCo allows none after start-up).

Each rank dir also holds `checksums.json` (sha256 of both files, written last). Loading
verifies it, so a truncated, emptied or bit-flipped file is named in a one-line warning
and the resume falls back to the newest step that is good on every rank
(`agree_resume_step`, a few small all-reduces at start-up). The ranks meet before any of
them lists the steps: a resume never judges a step another rank is still writing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

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


def sha256_file(path: Path) -> str:
    """A file's sha256 (hex), read in 4 MB blocks: the one helper for checkpoints, corpus shards and sources."""
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
            json.dump({"step": step, "sha256": {name: sha256_file(tmp / name) for name in _FILES}}, f)
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
            raise CheckpointError(
                f"{d / 'tensors.safetensors'}: not a safetensors file (empty, truncated or garbage)"
            ) from None
        if world_size != self.world_size:
            raise ValueError(f"checkpoint {d} was written by world_size={world_size}, this run has {self.world_size}")
        try:
            return unflatten_state(state, tensors)
        except (KeyError, TypeError, AttributeError):
            raise CheckpointError(
                f"{d / 'state.json'}: refers to tensors that {d / 'tensors.safetensors'} lacks"
            ) from None

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
        return [s for s in self._step_dirs() if (self.step_dir(s) / f"rank_{self.rank}").is_dir()]

    def agree_resume_step(self, world: World) -> int | None:
        """The newest step complete and intact on every rank; None: start afresh everywhere.

        Start-up only. The ranks first meet, then list: a rank still in its last save (a
        restart inside the same processes, as HDEE's consecutive runs or a preempted run and its
        resume in one test) is waited for, not judged mid-write. A step that some rank never
        finished (killed mid-save) or whose files are damaged falls back to an older one; with
        none, every rank starts afresh and rank 0 says so in one line. Only ranks whose views of
        the tree differ while each has files of its own (node-local disks) stop, with an error
        naming shared storage, instead of quietly restarting from step 0.
        """
        if not world.is_distributed:
            step = self.newest_good_step()
            if step is None and self.own_steps():
                log.warning(
                    "rank %d: no checkpoint step under %s is complete and intact; starting afresh", self.rank, self.root
                )
            return step

        def lowest(values: list[int]) -> list[int]:  # elementwise MIN over the ranks
            t = torch.tensor(values, dtype=torch.int64, device=world.device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=world.group)
            return t.tolist()

        lowest([0])  # the meeting point: every rank has returned from its last save
        good = self.good_steps()
        candidate = good[-1] if good else -1
        while True:
            [agreed] = lowest([candidate])
            if agreed < 0:
                break
            mine = max((s for s in good if s <= agreed), default=-1)
            if lowest([int(mine == agreed)]) == [1]:
                return agreed
            candidate = mine
        self._no_common_step(world, lowest)
        return None

    def _newest_rank_dirs(self) -> list[int]:
        """Per rank, the newest step at which this rank sees that rank's dir (-1: none)."""
        newest = [-1] * self.world_size
        for step in self._step_dirs():  # oldest first: a rank's newest dir is written last
            for r in range(self.world_size):
                if (self.step_dir(step) / f"rank_{r}").is_dir():
                    newest[r] = step
        return newest

    def _no_common_step(self, world: World, lowest: Callable[[list[int]], list[int]]) -> None:
        """Raise if the ranks' views prove the storage is not shared; otherwise log the fresh start.

        After the meeting nothing is written, so on shared storage every rank sees the same
        rank dirs. One all-reduce compares the views: the MIN and MAX over the ranks of each
        rank's newest dir, and whether every rank has a dir of its own.
        """
        seen = self._newest_rank_dirs()
        out = lowest(seen + [-s for s in seen] + [int(seen[self.rank] >= 0)])
        low, high, own_everywhere = out[: self.world_size], [-v for v in out[self.world_size : -1]], out[-1]
        if own_everywhere and low != high:
            raise RuntimeError(
                "no checkpoint step is complete and intact on every rank, and the ranks see different step dirs "
                f"under {self.root} (this rank sees its own at steps {self.own_steps()}, "
                f"each rank's newest at {seen}): "
                "checkpoints must live on storage that all ranks share. "
                "Point run_dir at shared storage, or set resume=false to start afresh"
            )
        if world.is_main and max(high) >= 0:
            log.warning(
                "no checkpoint step under %s is complete and intact on every rank (the newest, step %d, is "
                "unfinished or damaged on some rank); starting afresh",
                self.root,
                max(high),
            )

    def _step_dirs(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for d in self.root.iterdir() if (m := _STEP.match(d.name)))

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
