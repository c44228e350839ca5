"""Bad numbers (NaN, inf, out of range) and data/run_dir mismatches fail validation with one line naming the field."""

import pytest

from decentrain.config import config_from_dict, validate

TINY_DATA = {"seq_len": 32, "max_bytes_per_domain": 20000, "domains": ["licenses"]}


def _raw(**sections):
    raw = {
        "algorithm": {"name": "ddp"},
        "train": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 4},
        "launcher": {"nproc_per_node": 2},
        "data": dict(TINY_DATA),
    }
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return raw


@pytest.mark.parametrize(
    "sections, field",
    [
        ({"optim": {"lr": float("inf")}}, "optim.lr"),
        ({"optim": {"lr": 1e30}}, "optim.lr"),
        ({"optim": {"lr": float("nan")}}, "optim.lr"),
        ({"optim": {"betas": [0.9, 1.5]}}, "optim.betas[1]"),
        ({"optim": {"betas": [float("nan"), 0.95]}}, "optim.betas[0]"),
        ({"optim": {"min_lr_ratio": -5.0}}, "optim.min_lr_ratio"),
        ({"optim": {"grad_clip": float("nan")}}, "optim.grad_clip"),
        ({"optim": {"weight_decay": float("inf")}}, "optim.weight_decay"),
        ({"train": {"threads": -1}}, "train.threads"),
        ({"train": {"seed": -1}}, "train.seed"),
        ({"algorithm": {"name": "noloco", "outer_optimizer": {"lr": float("nan")}}}, "algorithm.outer_optimizer.lr"),
        ({"algorithm": {"name": "noloco", "gamma": float("nan")}}, "algorithm.gamma"),
        ({"algorithm": {"name": "noloco", "deadline_s": float("nan")}}, "algorithm.deadline_s"),
        (
            {"algorithm": {"name": "noloco", "outer_optimizer": {"momentum": float("nan")}}},
            "algorithm.outer_optimizer.momentum",
        ),
        ({"algorithm": {"name": "diloco", "outer_optimizer": {"lr": float("inf")}}}, "algorithm.outer_optimizer.lr"),
        (
            {"algorithm": {"name": "streaming_diloco", "outer_optimizer": {"momentum": 1.0}}},
            "algorithm.outer_optimizer.momentum",
        ),
    ],
)
def test_non_finite_or_out_of_range_numbers_fail_naming_field_and_range(sections, field):
    with pytest.raises(ValueError) as e:
        config_from_dict(_raw(**sections))
    msg = str(e.value)
    assert msg.startswith(field + "=") and "must be" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "sections, field",
    [
        ({"train": {"global_batch_size": 4096, "micro_batch_size": 2048}}, "train.global_batch_size"),
        ({"data": {"seq_len": 100000}}, "data.seq_len"),
    ],
)
def test_batch_or_seq_len_larger_than_the_data_fails_before_workers(sections, field):
    cfg = config_from_dict(_raw(**sections))
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate(cfg, world_size=2)


def test_run_dir_that_is_a_file_fails(tmp_path):
    f = tmp_path / "not_a_dir"
    f.write_text("x")
    for run_dir in (f, f / "sub"):
        with pytest.raises(ValueError, match="run_dir=.*is a file"):
            validate(config_from_dict(_raw(run_dir=str(run_dir))), world_size=2)
    validate(config_from_dict(_raw(run_dir=str(tmp_path / "new"))), world_size=2)
