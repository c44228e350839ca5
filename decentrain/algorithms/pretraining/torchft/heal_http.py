"""The heal channel: torchft's HTTP checkpoint server, carrying the heal state as JSON + safetensors.

torchft names this a "checkpoint transport"; here it is the heal channel (a replica group's state handed
to a group that heals), and "transport" means only how replicas reach each other (pretraining/transports/).
torchft's own channels unpickle what the peer sends (`_streaming_load(weights_only=False)`,
`pickle.loads` of PGTransport's metadata). A peer is data, never code: here the sender
encodes the state as decentrain's checkpoints are (core/comm/heal_transfer.py: a JSON skeleton plus one
safetensors blob, tensors cloned at send time, so the weights may move on while a
receiver fetches), torchft's HTTP server serves the two byte buffers as uint8 tensors,
and the receiver loads them with `weights_only=True` (tensors and plain containers only)
before parsing JSON and safetensors.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from torchft.checkpointing._serialization import _streaming_load
from torchft.checkpointing.http_transport import HTTPTransport

from decentrain.core.checkpoint import unflatten_state
from decentrain.core.comm.heal_transfer import encode_state
from decentrain.core.comm.wire import all_finite


class SafeHealHTTP(HTTPTransport):
    def __init__(self, timeout: timedelta) -> None:
        super().__init__(timeout=timeout, num_chunks=0)  # one request: the payload is two flat buffers

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        skeleton, blob = encode_state(state_dict)
        wire = {
            "skeleton": torch.frombuffer(bytearray(skeleton), dtype=torch.uint8),
            "blob": torch.frombuffer(bytearray(blob), dtype=torch.uint8),
        }
        super().send_checkpoint(dst_ranks, step, wire, timeout)

    @classmethod
    def _load_from_address(cls, address: str, timeout: timedelta) -> object:
        import urllib.request

        with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
            return _streaming_load(f, weights_only=True)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        wire = super().recv_checkpoint(src_rank, metadata, step, timeout)
        if not isinstance(wire, dict) or set(wire) != {"skeleton", "blob"}:
            raise ValueError("heal state from peer: not a {skeleton, blob} payload")
        skeleton = json.loads(bytes(wire["skeleton"].numpy()).decode("utf-8"))
        tensors = load_tensors(bytes(wire["blob"].numpy()))
        bad = [k for k, t in tensors.items() if t.is_floating_point() and not all_finite(t)]
        if bad:
            raise ValueError(f"heal state from peer: non-finite values in {sorted(bad)[:3]}")
        return unflatten_state(skeleton, tensors)
