"""transport=torchft: its settings in its own transport section, the variants' checks, per-group data slices
handed to the Trainer, the replica groups' command line, the pickle-free heal channel."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch

from decentrain.algorithms.pretraining.transports import TRANSPORTS, transport_spec
from decentrain.algorithms.pretraining.transports.torchft_groups import TorchFTConfig
from decentrain.config import config_from_dict
from decentrain.core.world import World

CONF = Path(__file__).resolve().parents[2] / "conf"


def cfg(algorithm: dict, transport: dict | None = None, launcher: dict | None = None):
    return config_from_dict(
        {
            "algorithm": algorithm,
            "transport": {"name": "torchft", **(transport or {})},
            "launcher": {"nproc_per_node": 1, **(launcher or {})},
        }
    )


def test_torchft_settings_live_in_the_transport_section_and_fail_in_one_line():
    t = cfg({"name": "ddp"}, {"replicas": 3, "lighthouse": "http://h:1", "heartbeat_timeout_ms": 900}).transport
    assert type(t) is TorchFTConfig and (t.replicas, t.lighthouse, t.heartbeat_timeout_ms) == (3, "http://h:1", 900)
    with pytest.raises(ValueError, match=r"transport.replica_id=2 must be a finite number in \[0, 2\)"):
        TorchFTConfig(replicas=2, replica_id=2)
    with pytest.raises(ValueError, match=r"transport.min_replicas=3 must be a finite number in \[1, 2\]"):
        TorchFTConfig(replicas=2, min_replicas=3)
    with pytest.raises(ValueError, match=r"transport.heartbeat_timeout_ms=0 must be"):
        cfg({"name": "ddp"}, {"heartbeat_timeout_ms": 0})
    with pytest.raises(ValueError, match=r"transport: unknown field\(s\) \['replicas'\]"):
        config_from_dict({"transport": {"name": "torch", "replicas": 2}})  # only torchft's section has them


@pytest.mark.parametrize(
    "old, new",
    [
        ({"fault_tolerance": "torchft"}, "launcher.fault_tolerance was removed; use transport=torchft"),
        ({"replicas": 2}, "launcher.replicas was removed; use transport.replicas"),
        ({"torchft": {"lighthouse": "http://h:1"}}, "launcher.torchft was removed; use transport=torchft"),
    ],
)
def test_the_old_launcher_keys_fail_naming_where_they_went(old, new):
    from decentrain.config import check_overrides, register_configs

    with pytest.raises(ValueError, match=new):
        config_from_dict({"launcher": old})
    register_configs()  # the schemas conf/ extends, as the recipe does at import
    key, value = next(iter(old.items()))
    override = f"launcher.{key}.lighthouse=http://h:1" if isinstance(value, dict) else f"launcher.{key}={value}"
    assert check_overrides(CONF, "config", [override]).startswith(new)  # the same line on the command line


def test_runs_torchft_cannot_carry_are_refused_by_the_variants_own_checks():
    pytest.importorskip("torchft")
    check = TRANSPORTS.get("torchft").check
    allowed = r"\['ddp', 'diloco', 'streaming_diloco'\]"
    with pytest.raises(ValueError, match=r"does not support algorithm.name='noloco'; allowed: " + allowed):
        check(cfg({"name": "noloco"}), 1)
    with pytest.raises(ValueError, match=r"launcher.nproc_per_node=2 with transport=torchft and algorithm=diloco: "):
        check(cfg({"name": "diloco"}, launcher={"nproc_per_node": 2}), 2)
    with pytest.raises(ValueError, match=r"inner_steps=10 must be a multiple of algorithm.num_fragments=4"):
        check(cfg({"name": "streaming_diloco", "inner_steps": 10, "num_fragments": 4}), 1)
    with pytest.raises(ValueError, match=r"overlap_steps=2 must be < inner_steps/num_fragments=2"):
        check(cfg({"name": "streaming_diloco", "inner_steps": 8, "num_fragments": 4, "overlap_steps": 2}), 1)
    with pytest.raises(ValueError, match=r"quantization='int4' .*allowed: none"):
        check(cfg({"name": "streaming_diloco", "inner_steps": 8, "num_fragments": 4, "quantization": "int4"}), 1)
    with pytest.raises(ValueError, match=r"algorithm.overlap=true with transport=torchft; allowed: false"):
        check(cfg({"name": "diloco", "overlap": True}), 1)
    with pytest.raises(ValueError, match=r"algorithm.rounds.mode=quorum runs on the transport's board"):
        check(cfg({"name": "diloco", "rounds": {"mode": "quorum"}}), 1)  # before any worker, not in one
    with pytest.raises(ValueError, match=r"engine.name='deepspeed' with transport=torchft; allowed: torch"):
        check(
            config_from_dict(
                {"algorithm": {"name": "ddp"}, "transport": {"name": "torchft"}, "engine": {"name": "deepspeed"}}
            ),
            1,
        )
    check(cfg({"name": "ddp"}, launcher={"nproc_per_node": 2}), 2)  # DDP: any ranks per group


def test_each_group_reads_its_own_slice_and_positions_agree():
    from decentrain.algorithms.pretraining.torchft import replica_sampler

    slices, positions = [], []
    for replica in range(2):
        for rank in range(2):
            group = TorchFTConfig(replicas=2, replica_id=replica, lighthouse="http://h:1").replica_group()
            s = replica_sampler(64, 8, World(rank=rank, world_size=2), group, seed=0)
            slices.append(set(s.next_indices().tolist()))
            positions.append(s.state_dict())
    assert all(len(x) == 4 for x in slices)
    assert len(set().union(*slices)) == 16  # disjoint: 2 groups x 2 ranks x 4 blocks
    assert all(p == positions[0] for p in positions)  # a healed group loading a peer's position reads its own slice


def test_the_trainer_is_handed_the_groups_sampler(tmp_path):
    """The transport gives the Trainer its sampler at construction (no attribute patched on a built trainer):
    group 1 of 2 reads the second half of the doubled batch of one seeded order."""
    from decentrain.algorithms.ddp.ddp import DDP
    from decentrain.algorithms.pretraining.trainer import Trainer
    from decentrain.data.blocks import ShardedSampler, build_corpus
    from decentrain.models.factory import build_model, build_tokenizer

    base = {
        "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
        "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
        "train": {"global_batch_size": 4, "micro_batch_size": 2},
    }
    run = config_from_dict({**base, "transport": {"name": "torchft", "replica_id": 1, "lighthouse": "http://h:1"}})
    tok = build_tokenizer(run.model)
    trainer = Trainer(
        run.train,
        World(),
        DDP(run.algorithm, World()),
        build_model(run.model, tok),
        build_corpus(run.data, tok),
        tmp_path,
        sampler=transport_spec(run).sampler(run, World()),
    )
    whole = ShardedSampler(len(trainer.train_blocks), 8, 0, 1, run.train.seed).next_indices().tolist()
    assert trainer.sampler.next_indices().tolist() == whole[4:]
    plain = config_from_dict(base)
    assert transport_spec(plain).sampler(plain, World()) is None  # transport=torch: the Trainer's own


def test_the_replica_groups_command_sets_the_transport_fields_once():
    from decentrain.algorithms.pretraining.torchft.launch import replica_group_command

    argv = [
        "transport=torchft",
        "transport.replica_id=7",
        "transport.lighthouse=http://old:1",
        "run_dir=/x",
        "train.steps=4",
    ]
    cmd = replica_group_command(argv, 1, 2, "/runs/a", "http://h:9", max_restarts=3)
    assert cmd[-4:] == [
        "run_dir=/runs/a/replica_1",
        "hydra.run.dir=/runs/a/replica_1",
        "transport.replica_id=1",
        "transport.lighthouse=http://h:9",
    ]
    assert "transport.replica_id=7" not in cmd and "run_dir=/x" not in cmd and "train.steps=4" in cmd
    assert "--nproc-per-node=2" in cmd and "--max-restarts=3" in cmd


def test_the_heal_channel_round_trips_state_and_refuses_pickles():
    pytest.importorskip("torchft")
    from torchft.checkpointing.http_transport import HTTPTransport

    from decentrain.algorithms.pretraining.torchft.heal_http import SafeHealHTTP

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {
        "user": {
            "default": {
                "step": 7,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "sampler": {"epoch": 0, "position": 56},
            }
        },
        "torchft": {"step": 7, "batches_committed": 14},
    }
    t = SafeHealHTTP(timedelta(seconds=10))
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
            SafeHealHTTP._load_from_address(f"{evil.metadata()}1/full", timedelta(seconds=10))
    finally:
        evil.shutdown()
