"""`launcher.name` picks an entry of LAUNCHERS (core/launch/config.py), each with its own config class, the
way every other component is picked; its `launch` starts this host's workers with core/launch/launcher.py."""

from __future__ import annotations

import pytest

from decentrain.config import config_from_dict
from decentrain.core.launch import launcher
from decentrain.core.launch.config import LAUNCHERS, HostsConfig, LocalConfig, TorchrunConfig
from decentrain.core.launch.launcher import HostSlot

HOSTS = {"name": "hosts", "nnodes": 2, "node_rank": 1, "store": "h:29400", "job_id": "job-1", "nproc_per_node": 2}


def test_each_launcher_types_its_section_with_its_own_class():
    assert LAUNCHERS.names() == ["hosts", "local", "torchrun"]
    assert type(config_from_dict({}).launcher).__name__ == "LauncherConfig"  # the default: local's fields, untyped
    assert type(config_from_dict({"launcher": {"name": "local"}}).launcher) is LocalConfig
    run = config_from_dict({"launcher": {"name": "torchrun"}}).launcher
    assert type(run) is TorchrunConfig and run.nproc_per_node is None and run.world_size is None
    hosts = config_from_dict({"launcher": HOSTS}).launcher
    assert type(hosts) is HostsConfig and (hosts.store, hosts.node_rank, hosts.world_size) == ("h:29400", 1, 4)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"name": "slurm"}, r"launcher.name='slurm' is unknown; allowed: \['hosts', 'local', 'torchrun'\]"),
        ({"name": "torchrun", "job_id": "j"}, r"launcher: unknown field\(s\) \['job_id'\]"),  # a hosts field elsewhere
        ({"name": "local", "nnodes": 2}, r"launcher.nnodes=2: launcher=local starts workers on this machine only"),
        ({**HOSTS, "node_rank": 2}, r"launcher.node_rank=2 must be in \[0, launcher.nnodes=2\)"),
    ],
)
def test_a_launcher_refuses_what_it_cannot_start_in_one_line(section, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict({"launcher": section})


@pytest.mark.parametrize(
    "section, survivors, expected",
    [
        ({"name": "local"}, True, ("survivors", None)),  # gossip on one node: the survivor launcher
        ({"name": "local"}, False, ("workers", None)),  # collective: torch elastic
        (
            {"name": "torchrun", "nproc_per_node": 2, "nnodes": 2},
            True,
            ("workers", None),
        ),  # several nodes, no job store
        (HOSTS, True, ("survivors", HostSlot("h:29400", 1, 2, "job-1"))),  # a client of the job store
        (HOSTS, False, ("workers", "job-1")),  # torch elastic, the job's id its rendezvous id
    ],
)
def test_each_launcher_starts_its_workers_its_own_way(monkeypatch, section, survivors, expected):
    calls = []
    monkeypatch.setattr(launcher, "launch_survivors", lambda *a, slot=None, **kw: calls.append(("survivors", slot)))
    monkeypatch.setattr(launcher, "launch_workers", lambda *a, run_id=None, **kw: calls.append(("workers", run_id)))
    cfg = config_from_dict({"launcher": section}).launcher
    LAUNCHERS.get(cfg.name).launch(
        ["train.steps=1"], cfg, module="recipes.train", run_dir="/tmp/x", survivors=survivors
    )
    assert calls == [expected]
