"""Healing a replacement worker: a live peer's training state, moved over their pair group.

The state (model, optimizer, schedule, sampler, outer state, counters) travels as the
checkpoint format does: a JSON skeleton plus one safetensors blob, never a pickle. A fixed
header (magic, both lengths, a CRC32) comes first; the receiver refuses lengths beyond its
limit before allocating, then checks the CRC, parses, and accepts the state only if it has
exactly the structure, tensor names, shapes and dtypes of its own, with finite values.

torchft heals over HTTP (`CheckpointTransport`, torch.save/load under the hood); here both
sides already hold a 2-rank gloo group for the pair, so the state rides on it, and the
payload stays pickle-free (a peer is untrusted).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from decentrain.core.checkpoint import flatten_state, unflatten_state
from decentrain.core.comm.wire import Tags, all_finite

HEAL_MAGIC = 0x6865_616C_7374  # "healst"


def encode_state(state: dict[str, Any]) -> tuple[bytes, bytes]:
    tensors: dict[str, torch.Tensor] = {}
    skeleton = flatten_state(state, tensors)
    return json.dumps(skeleton).encode(), save_tensors(tensors)


def send_state(pg: dist.ProcessGroupGloo, dst: int, skeleton: bytes, blob: bytes) -> None:
    """Send an encoded state to `dst` of the pair group (blocks until it was taken)."""
    crc = zlib.crc32(blob, zlib.crc32(skeleton))
    header = torch.tensor([HEAL_MAGIC, len(skeleton), len(blob), crc], dtype=torch.int64)
    works = [pg.send([header], dst, Tags.heal(0))]
    works += [
        pg.send([torch.frombuffer(bytearray(b), dtype=torch.uint8)], dst, Tags.heal(1 + i))
        for i, b in enumerate((skeleton, blob))
        if b
    ]
    for w in works:
        w.wait()


def recv_state(pg: dist.ProcessGroupGloo, src: int, limit_bytes: int) -> tuple[bytes, bytes] | str:
    """Receive an encoded state from `src`; returns (skeleton, blob) or why it was refused."""
    header = torch.zeros(4, dtype=torch.int64)
    pg.recv([header], src, Tags.heal(0)).wait()
    magic, n_skel, n_blob, crc = header.tolist()
    if magic != HEAL_MAGIC:
        return "bad magic"
    if not (0 < n_skel <= limit_bytes and 0 < n_blob <= limit_bytes):
        return f"sizes {n_skel}/{n_blob} beyond the limit {limit_bytes}"
    bufs = [torch.empty(n, dtype=torch.uint8) for n in (n_skel, n_blob)]
    for i, b in enumerate(bufs):
        pg.recv([b], src, Tags.heal(1 + i)).wait()
    skeleton, blob = (b.numpy().tobytes() for b in bufs)
    if zlib.crc32(blob, zlib.crc32(skeleton)) != crc:
        return "checksum differs from the header's"
    return skeleton, blob


_MAX_INT = 1 << 53
# Scalars that count or schedule: negative values are nonsense from a peer (e.g. a -inf or
# negative learning rate, a negative step). Matched on the last key of the path.
_NON_NEGATIVE = re.compile(r"(^|_)(step|steps|round|rounds|count|done|lr|epoch|position|offset|tokens)s?$|^initial_lr$")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _scalar_problem(got: Any, want: Any, path: str) -> str | None:
    """Exact scalar types (an int stays an int, a bool a bool), finite floats, ints in range."""
    if want is None or got is None:
        # An unset value (e.g. no loss yet) on one side; the other may hold a number.
        ok = got is None or (type(got) in (int, float) and type(want) in (int, float, type(None)))
        return None if ok or type(got) is type(want) else f"{path}: type differs"
    if type(got) is not type(want):
        return f"{path}: type differs ({type(got).__name__}, want {type(want).__name__})"
    if type(got) is float and not math.isfinite(got):
        return f"{path}: non-finite"
    if type(got) is int and not -_MAX_INT <= got <= _MAX_INT:
        return f"{path}: out of range"
    if type(got) in (int, float) and got < 0 and _NON_NEGATIVE.search(path.rsplit(".", 1)[-1]):
        return f"{path}: negative"
    return None


def _structure_problem(got: Any, want: Any, path: str = "") -> str | None:
    """Where `got` (a peer's JSON skeleton) differs from `want` (ours) in shape, type or range."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{path or 'state'}: keys differ"
        return next((p for k in want if (p := _structure_problem(got[k], want[k], f"{path}.{k}"))), None)
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{path}: length differs"
        return next(
            (p for i, (g, w) in enumerate(zip(got, want)) if (p := _structure_problem(g, w, f"{path}.{i}"))), None
        )
    if isinstance(got, (dict, list)):
        return f"{path}: type differs"
    return _scalar_problem(got, want, path)


def decode_state(skeleton: bytes, blob: bytes, like: dict[str, Any]) -> dict[str, Any] | str:
    """The peer's state if it has exactly `like`'s structure, tensor names, shapes and dtypes, all finite."""
    try:
        got = json.loads(skeleton.decode("utf-8"), parse_constant=_refuse_constant)  # no NaN/Infinity
        tensors = load_tensors(blob)
    except (ValueError, UnicodeDecodeError, RuntimeError) as e:  # safetensors raises SafetensorError(Exception)
        return f"unparsable: {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 -- SafetensorError derives from Exception only
        return f"unparsable: {type(e).__name__}"
    mine: dict[str, torch.Tensor] = {}
    want = flatten_state(like, mine)
    if (problem := _structure_problem(got, want)) is not None:
        return problem
    if set(tensors) != set(mine):
        return "tensor names differ"
    for k, t in sorted(tensors.items()):  # a fixed order: the same state always gives the same reason
        if t.shape != mine[k].shape or t.dtype != mine[k].dtype:
            return f"{k}: {tuple(t.shape)} {t.dtype} != {tuple(mine[k].shape)} {mine[k].dtype}"
        if not all_finite(t):
            return f"{k}: non-finite values"
    return unflatten_state(got, tensors)
