"""launcher.fault_tolerance=torchft: config checks, per-group data slices, the pickle-free heal transport."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from decentrain.config import config_from_dict
from decentrain.core.launch.config import LauncherConfig
from decentrain.core.launch.ft_config import TorchFTConfig
from decentrain.core.world import World


def cfg(algorithm: dict, launcher: dict | None = None):
    launcher = {"fault_tolerance": "torchft", "replicas": 2, "nproc_per_node": 1, **(launcher or {})}
    return config_from_dict({"algorithm": algorithm, "launcher": launcher})


def test_launcher_fields_fail_in_one_line():
    with pytest.raises(ValueError, match=r"launcher.replicas=2 needs launcher.fault_tolerance=torchft"):
        LauncherConfig(replicas=2)
    with pytest.raises(ValueError, match=r"launcher.fault_tolerance='elastic' is unknown; allowed: \['none', 'torchft'\]"):
        LauncherConfig(fault_tolerance="elastic")
    with pytest.raises(ValueError, match=r"launcher.torchft.replica_id=2 must be in \[0, launcher.replicas=2\)"):
        LauncherConfig(fault_tolerance="torchft", replicas=2, torchft=TorchFTConfig(replica_id=2))
    with pytest.raises(ValueError, match=r"launcher.torchft.heartbeat_timeout_ms=0 must be >= 1"):
        TorchFTConfig(heartbeat_timeout_ms=0)


def test_runs_torchft_cannot_carry_are_refused():
    pytest.importorskip("torchft")
    from decentrain.algorithms.pretraining.torchft.preflight import check_fault_tolerant_run

    with pytest.raises(ValueError, match=r"does not support algorithm.name='noloco'; allowed: \['ddp', 'diloco', 'streaming_diloco'\]"):
        check_fault_tolerant_run(cfg({"name": "noloco"}), 1)
    with pytest.raises(ValueError, match=r"launcher.nproc_per_node=2 .* algorithm=diloco: allowed 1"):
        check_fault_tolerant_run(cfg({"name": "diloco"}, {"nproc_per_node": 2}), 2)
    with pytest.raises(ValueError, match=r"inner_steps=10 must be a multiple of algorithm.num_fragments=4"):
        check_fault_tolerant_run(cfg({"name": "streaming_diloco", "inner_steps": 10, "num_fragments": 4}), 1)
    with pytest.raises(ValueError, match=r"overlap_steps=2 must be < inner_steps/num_fragments=2"):
        check_fault_tolerant_run(cfg({"name": "streaming_diloco", "inner_steps": 8, "num_fragments": 4, "overlap_steps": 2}), 1)
    with pytest.raises(ValueError, match=r"quantization='int4' .*allowed: none"):
        check_fault_tolerant_run(cfg({"name": "streaming_diloco", "inner_steps": 8, "num_fragments": 4, "quantization": "int4"}), 1)
    with pytest.raises(ValueError, match=r"algorithm.overlap=true with launcher.fault_tolerance=torchft; allowed: false"):
        check_fault_tolerant_run(cfg({"name": "diloco", "overlap": True}), 1)
    check_fault_tolerant_run(cfg({"name": "ddp"}, {"nproc_per_node": 2}), 2)  # DDP: any ranks per group


def test_each_group_reads_its_own_slice_and_positions_agree():
    from decentrain.algorithms.pretraining.torchft import ReplicaGroup, replica_sampler

    slices, positions = [], []
    for replica in range(2):
        for rank in range(2):
            s = replica_sampler(64, 8, World(rank=rank, world_size=2), ReplicaGroup(replica, 2, TorchFTConfig()), seed=0)
            slices.append(set(s.next_indices().tolist()))
            positions.append(s.state_dict())
    assert all(len(x) == 4 for x in slices)
    assert len(set().union(*slices)) == 16  # disjoint: 2 groups x 2 ranks x 4 blocks
    assert all(p == positions[0] for p in positions)  # a healed group loading a peer's position reads on in its own slice


def test_safe_transport_round_trips_state_and_refuses_pickles():
    pytest.importorskip("torchft")
    from torchft.checkpointing.http_transport import HTTPTransport

    from decentrain.algorithms.pretraining.torchft.transport import SafeHTTPTransport

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {"user": {"default": {"step": 7, "model": model.state_dict(), "optimizer": opt.state_dict(),
                                  "sampler": {"epoch": 0, "position": 56}}}, "torchft": {"step": 7, "batches_committed": 14}}
    t = SafeHTTPTransport(timedelta(seconds=10))
    try:
        t.send_checkpoint([1], 7, state, timedelta(seconds=10))
        got = t.recv_checkpoint(0, t.metadata(), 7, timedelta(seconds=10))
    finally:
        t.shutdown()
    torch.testing.assert_close(got, state, rtol=0, atol=0)
    fresh = torch.optim.AdamW(model.parameters())
    fresh.load_state_dict(got["user"]["default"]["optimizer"])  # int keys and param groups survive JSON

    class Payload:  # what torchft's own transport would unpickle (and run __reduce__ of)
        pass

    evil = HTTPTransport(timedelta(seconds=10), num_chunks=0)
    try:
        evil.send_checkpoint([1], 1, {"x": Payload()}, timedelta(seconds=10))
        with pytest.raises(Exception, match="(?i)weights.only|unsupported|global"):
            SafeHTTPTransport._load_from_address(f"{evil.metadata()}1/full", timedelta(seconds=10))
    finally:
        evil.shutdown()
