"""SAPO identity and membership config: empty swarm keys, unsafe names and unvetted tasks fail
before start, naming the field."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from decentrain.algorithms.sapo.config import SAPOConfig
from decentrain.config import register_configs

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_empty_swarm_key_is_refused_at_config_time():
    with pytest.raises(ValueError, match="swarm_key must be a non-empty string"):
        SAPOConfig(swarm_key="")
    assert SAPOConfig(swarm_key="s3cret").swarm_key == "s3cret"
    assert SAPOConfig(swarm_key=None).swarm_key is None


@pytest.mark.parametrize("name", ["", "a\x00b", "\u202eevil", "zero\u200bwidth", "../up", "x" * 65, "a b"])
def test_unsafe_node_names_are_refused(name):
    with pytest.raises(ValueError, match="node_id"):
        SAPOConfig(node_id=name)


def test_shared_key_file_needs_a_per_node_placeholder():
    with pytest.raises(ValueError, match=r"key_file='keys/k' must contain '\{node\}'"):
        SAPOConfig(key_file="keys/k", num_nodes=2)
    SAPOConfig(key_file="keys/{node}.key", num_nodes=2)
    SAPOConfig(key_file="keys/k", num_nodes=1)


def test_unvetted_task_in_a_node_override_fails_naming_it():
    with pytest.raises(ValueError, match=r"nodes\[0\].task: tasks='composite' is not a vetted task"):
        SAPOConfig(nodes=[{"task": {"tasks": ["composite"]}}])


def test_recipe_config_refuses_empty_key_and_unvetted_task():
    register_configs("sapo")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for override, match in (("swarm_key=''", "swarm_key"), ("task.tasks=[composite]", "not a vetted task")):
            cfg = compose(config_name="rl", overrides=[override, "run_dir=/tmp/x"])
            raw = OmegaConf.to_container(cfg, resolve=False)
            raw.pop("run_dir")
            with pytest.raises(ValueError, match=match):
                OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SAPOConfig), raw))
