import pytest

from decentrain.config import config_from_dict, validate


def _raw(**sections):
    raw = {
        "algorithm": {"name": "ddp"},
        "train": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 4},
        "launcher": {"nproc_per_node": 2},
    }
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    return raw


def test_good_config_converts_to_dataclasses():
    cfg = config_from_dict(_raw())
    validate(cfg, world_size=2)
    assert type(cfg.algorithm).__name__ == "DDPConfig" and cfg.train.steps == 10


@pytest.mark.parametrize(
    "sections, field, allowed",
    [
        ({"algorithm": {"name": "adam_swarm"}}, "algorithm.name", "ddp"),
        ({"model": {"family": "gpt9"}}, "model.family", "llama"),
        ({"data": {"domains": ["klingon"]}}, "data.domains", "python_stdlib"),
        ({"logger": {"wandb_mode": "loud"}}, "logger.wandb_mode", "offline"),
        ({"optim": {"schedule": "zigzag"}}, "optim.schedule", "cosine"),
    ],
)
def test_unknown_names_fail_naming_field_and_allowed_values(sections, field, allowed):
    with pytest.raises(ValueError) as e:
        config_from_dict(_raw(**sections))
    assert field in str(e.value) and allowed in str(e.value)


@pytest.mark.parametrize("steps", [0, -3])
def test_non_positive_steps_fail(steps):
    with pytest.raises(ValueError, match="train.steps"):
        config_from_dict(_raw(train={"steps": steps}))


def test_unknown_keys_fail():
    with pytest.raises(ValueError, match="hiden_size"):
        config_from_dict(_raw(model={"hiden_size": 3}))


def test_batch_that_does_not_divide_fails():
    cfg = config_from_dict(_raw(train={"global_batch_size": 12, "micro_batch_size": 4}))
    with pytest.raises(ValueError, match=r"train.global_batch_size=12.*multiple of 8"):
        validate(cfg, world_size=2)


def test_world_size_must_match_the_launcher():
    cfg = config_from_dict(_raw())
    with pytest.raises(ValueError, match="launcher.nproc_per_node=2"):
        validate(cfg, world_size=4)
    validate(
        config_from_dict(_raw(launcher={"name": "torchrun", "nproc_per_node": None}, train={"global_batch_size": 16})),
        world_size=4,
    )


def test_local_launcher_refuses_several_nodes():
    with pytest.raises(ValueError, match="launch/multinode.sh"):
        config_from_dict(_raw(launcher={"nnodes": 2}))


def test_adaptive_inner_steps_need_whole_rounds():
    cfg = config_from_dict(_raw(algorithm={"name": "noloco", "inner_steps": 4, "adaptive_inner_steps": True}))
    with pytest.raises(ValueError, match="multiple of algorithm.inner_steps=4"):
        validate(cfg, world_size=2)
