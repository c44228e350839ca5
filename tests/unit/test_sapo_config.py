"""SAPO config: bad values fail before start naming the field; per-node overrides; Hydra composition."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from decentrain.algorithms.sapo.batching import SwarmBatchConfig
from decentrain.algorithms.sapo.config import NodeOverride, RLLoopConfig, SAPOConfig
from decentrain.algorithms.sapo.exchange import ExchangeConfig
from decentrain.algorithms.sapo.grpo import SAPOLossConfig
from decentrain.algorithms.sapo.payload import PayloadLimits
from decentrain.config import register_configs
from decentrain.tasks import TaskMixConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_i_plus_j_zero_names_the_field():
    with pytest.raises(ValueError, match=r"num_local \+ num_external"):
        SwarmBatchConfig(num_local=0, num_external=0)


def test_external_groups_in_silo_mode_fail():
    with pytest.raises(ValueError, match=r"batch.num_external=2 .*silo"):
        SAPOConfig(exchange=ExchangeConfig(name="silo"), batch=SwarmBatchConfig(6, 2))
    SAPOConfig(exchange=ExchangeConfig(name="silo"), batch=SwarmBatchConfig(8, 0))


def test_unknown_task_and_exchange_fail():
    with pytest.raises(ValueError, match=r"tasks='no_such_task'"):
        TaskMixConfig(tasks=["no_such_task"])
    with pytest.raises(ValueError, match=r"exchange.name='carrier_pigeon'"):
        ExchangeConfig(name="carrier_pigeon")


def test_generation_count_must_match_payload_schema():
    with pytest.raises(ValueError, match="payload.num_generations=8 must equal loss.num_generations=4"):
        SAPOConfig(loss=SAPOLossConfig(num_generations=4), payload=PayloadLimits(num_generations=8))


def test_node_overrides_resolve_and_fail_naming_the_field():
    cfg = SAPOConfig(
        nodes=[
            NodeOverride(),
            NodeOverride(model={"family": "qwen2", "hidden_size": 64}, batch={"num_local": 6, "num_external": 2}),
        ]
    )
    assert cfg.for_node(0).model == cfg.model
    n1 = cfg.for_node(1)
    assert (n1.model.family, n1.model.hidden_size, n1.batch.num_local) == ("qwen2", 64, 6)
    assert cfg.for_node(7).model == cfg.model  # past the list: shared values
    with pytest.raises(ValueError, match=r"nodes\[0\].model: unknown field\(s\) \['hiden_size'\]"):
        SAPOConfig(nodes=[NodeOverride(model={"hiden_size": 64})])
    with pytest.raises(ValueError, match=r"nodes\[0\].task: .*tasks='nope'"):
        SAPOConfig(nodes=[NodeOverride(task={"tasks": ["nope"]})])
    with pytest.raises(ValueError, match=r"nodes\[0\].batch.num_external=4 must be 0"):
        SAPOConfig(
            exchange=ExchangeConfig(name="silo"),
            batch=SwarmBatchConfig(8, 0),
            nodes=[NodeOverride(batch={"num_local": 4, "num_external": 4})],
        )


@pytest.mark.parametrize(
    "preset", ["swarm_8_0", "swarm_6_2", "swarm_4_4", "swarm_2_6", "silo", "hivemind", "heterogeneous", "learn_cpu"]
)
def test_rl_presets_compose_to_typed_config(preset):
    register_configs("sapo")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        dcfg = compose("rl", overrides=[f"sapo={preset}", "run_dir=/tmp/x"])
    cfg = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(SAPOConfig), OmegaConf.to_container(dcfg, resolve=True))
    )
    assert isinstance(cfg, SAPOConfig) and cfg.payload.num_generations == cfg.loss.num_generations
    assert cfg.batch.num_local + cfg.batch.num_external == 8
    hm = cfg.exchange.hivemind  # local runs never probe NAT
    assert not (hm.nat_port_map or hm.use_relay or hm.use_auto_relay or hm.auto_nat)
    if preset == "heterogeneous":
        assert cfg.for_node(1).model.family == "qwen2" and cfg.for_node(2).task.tasks == ["chain_sum"]
    if preset == "learn_cpu":  # the learning setup: three tasks, no partial credit, T=1, top-k off, held-out eval
        assert cfg.task.tasks == ["basic_arithmetic", "chain_sum", "leg_counting"] and cfg.reward.kind == "exact"
        assert (cfg.sampling.temperature, cfg.sampling.top_k, cfg.eval.every) == (1.0, None, 25)


def test_sft_config_composes():
    register_configs("sapo")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        dcfg = compose("sft", overrides=["run_dir=/tmp/x", "sft.steps=3"])
    assert dcfg.sft.steps == 3 and dcfg.model.hidden_size == 192


def test_prioritized_sampling_needs_spo():
    with pytest.raises(ValueError, match="train.prioritized_sampling=True needs loss.advantage='spo'"):
        SAPOConfig(train=RLLoopConfig(prioritized_sampling=True))
    SAPOConfig(train=RLLoopConfig(prioritized_sampling=True), loss=SAPOLossConfig(advantage="spo"))
