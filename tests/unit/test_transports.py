"""One word, transport: `transport.name` picks a registry entry, a `TransportSpec` (pretraining/transports/), and
adding one is one module plus one YAML."""

import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from decentrain.algorithms.pretraining import transports
from decentrain.algorithms.pretraining.run import run_pretraining
from decentrain.algorithms.pretraining.transports import TRANSPORTS, transport_spec
from decentrain.config import config_from_dict, register_configs, validate
from decentrain.core.comm.dist_transport import TorchTransport
from decentrain.core.comm.inprocess_transport import InProcessTransport
from decentrain.core.registry import discover
from decentrain.core.world import World
from decentrain.testing import TINY

CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()  # the schemas conf/ extends, as recipes/train.py does at import


def _compose(*overrides: str, search: Path | None = None):
    GlobalHydra.instance().clear()
    extra = [f"hydra.searchpath=[file://{search}]"] if search else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=[*TINY, "run_dir=/tmp/x", "launcher.nproc_per_node=1", *extra, *overrides]
        )
    return config_from_dict(OmegaConf.to_container(cfg, resolve=True))


def test_the_shipped_transports_register_themselves():
    assert TRANSPORTS.names() == ["inprocess", "torch", "torchft"]  # found by the package's module list


def test_torch_is_the_default_and_a_named_transport_is_its_own_config_class():
    assert _compose().transport.name == "torch"
    cfg = _compose("transport=torchft", "transport.replicas=3")
    assert transport_spec(cfg) is TRANSPORTS.get("torchft") and cfg.transport.replicas == 3
    cfg = _compose("transport=inprocess", "transport.replicas=4", "algorithm=noloco")
    assert transport_spec(cfg) is TRANSPORTS.get("inprocess") and cfg.transport.replicas == 4
    assert type(cfg.transport).__name__ == "InProcessConfig"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["transport=torchft", "algorithm=noloco"], "transport=torchft does not support algorithm.name='noloco'"),
        (["transport=inprocess", "transport.replicas=3", "algorithm=noloco"], "world size 3 is odd"),
        (["transport=inprocess", "algorithm=ddp"], "transport.name=inprocess with algorithm.name=ddp"),
        (
            ["transport=inprocess", "transport.replicas=3", "algorithm=diloco"],
            "does not divide into transport.replicas=3",
        ),
    ],
)
def test_a_run_the_transport_cannot_carry_fails_in_one_line_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(_compose(*overrides), 1)


def test_unknown_fields_and_transports_fail_naming_the_field():
    with pytest.raises(ValueError, match=r"transport: unknown field\(s\) \['replicas'\]"):
        config_from_dict({"transport": {"name": "torch", "replicas": 2}})
    with pytest.raises(
        ValueError, match=r"transport.name='carrier_pigeon' is unknown; allowed: \['inprocess', 'torch', 'torchft'\]"
    ):
        config_from_dict({"transport": {"name": "carrier_pigeon"}})
    with pytest.raises(ValueError, match=r"transport.replicas=0"):
        config_from_dict({"transport": {"name": "inprocess", "replicas": 0}})


def test_the_loop_algorithms_talk_through_the_transport_they_are_given():
    cfg = _compose("algorithm=noloco")
    algorithm = transport_spec(cfg).algorithm(cfg, World())
    assert type(algorithm.transport) is TorchTransport
    built_by_hand = type(algorithm)(cfg.algorithm, World())  # no spec set one: the default transport's
    assert type(built_by_hand.transport) is TorchTransport


# -- adding a transport: one module in the package, one YAML in conf/transport/ ---------------------

EXAMPLE_MODULE = '''"""`transport=solo`: one replica alone over an in-process hub (an example entry)."""

from __future__ import annotations

from dataclasses import dataclass

from decentrain.algorithms.pretraining.transports import TRANSPORTS, TransportConfig, TransportSpec
from decentrain.core.comm.inprocess_transport import InProcessHub


@dataclass
class SoloConfig(TransportConfig):
    name: str | None = "solo"
    deadline_s: float = 1.0


@TRANSPORTS.register("solo", config=SoloConfig)
class SoloSpec(TransportSpec):
    @classmethod
    def check(cls, cfg, world_size: int) -> None:
        if world_size != 1:
            raise ValueError(f"transport.name=solo runs one replica; got a world of {world_size}")

    @classmethod
    def connect(cls, world, cfg):
        return InProcessHub(1, cfg.deadline_s).transport(0)
'''

EXAMPLE_YAML = """defaults:
  - solo_schema
  - _self_
name: solo
deadline_s: 2.0
"""


@pytest.fixture
def solo(tmp_path):
    """The two files, put where the package and Hydra look (a second package dir, a second conf dir)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "solo.py").write_text(EXAMPLE_MODULE)
    conf = tmp_path / "conf" / "transport"
    conf.mkdir(parents=True)
    (conf / "solo.yaml").write_text(EXAMPLE_YAML)
    transports.__path__.append(str(pkg))
    try:
        discover(transports.__name__, [str(pkg)])  # what importing the package does for a file in its directory
        register_configs()  # stores solo_schema, as every recipe does at import
        yield tmp_path / "conf"
    finally:
        transports.__path__.remove(str(pkg))
        TRANSPORTS._entries.pop("solo", None)
        sys.modules.pop(f"{transports.__name__}.solo", None)


def test_a_new_transport_is_one_module_plus_one_yaml_and_trains_end_to_end(solo, tmp_path):
    cfg = _compose(
        "transport=solo",
        "algorithm=diloco",
        "algorithm.inner_steps=2",
        "train.steps=4",
        "train.eval_every=4",
        "train.checkpoint_every=100",
        search=solo,
    )
    assert (
        transport_spec(cfg) is TRANSPORTS.get("solo") and cfg.transport.deadline_s == 2.0
    )  # the YAML's value, the module's class
    validate(cfg, 1)
    with pytest.raises(ValueError, match="transport.name=solo runs one replica; got a world of 2"):
        transport_spec(cfg).check(cfg, 2)
    algorithm = transport_spec(cfg).algorithm(cfg, World())
    assert type(algorithm.transport) is InProcessTransport
    torch.set_num_threads(1)
    result = run_pretraining(cfg, World(), tmp_path / "run")
    assert result.final_step == 4 and (tmp_path / "run" / "model").is_dir()
