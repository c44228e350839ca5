"""A mistyped input fails before anything starts, in one line that names the field and what is close.

Paths (model.pretrained / model.tokenizer / data files), text too short for one block, unknown
override keys and group options. On the old code a missing `ckpt/...` went to the hub (~50 s of
retries), an unknown key got Hydra's "use +train.stepz=10", and the option list offered `*_schema`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decentrain.config import check_overrides, config_from_dict, register_configs, validate
from decentrain.models.factory import check_model_source
from recipes import conf_dir

ROOT = Path(__file__).resolve().parents[2]
register_configs()  # the schemas `conf/config.yaml` extends, as recipes/train.py registers them


def _never_called(repo_id):
    raise AssertionError(f"the hub was asked about {repo_id!r}")


def test_missing_dir_under_a_local_folder_is_a_path_not_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt" / "sapo_sft").mkdir(parents=True)
    with pytest.raises(ValueError) as e:
        check_model_source("ckpt/sapo_stf", "model.pretrained", _never_called)
    assert str(e.value).startswith("model.pretrained=ckpt/sapo_stf: no such directory")
    assert "ckpt/sapo_sft" in str(e.value)  # the close match


@pytest.mark.parametrize("value", ["./nope", "/no/such/dir", "~/no_such_dir_xyz", "a/b/c"])
def test_path_shaped_values_never_reach_the_hub(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^model.tokenizer=.*: no such directory"):
        check_model_source(value, "model.tokenizer", _never_called)


def test_hub_id_offline_and_not_cached_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        check_model_source("decentrain-tests/no-such-model", "model.pretrained", _never_called)


def test_hub_id_online_is_asked_once_and_its_answer_is_the_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    asked = []
    problem = "and the hub cannot be reached (ConnectError)"
    with pytest.raises(
        ValueError, match=r"model.pretrained=decentrain-tests/no-such-model: no such local directory, and the hub"
    ):
        check_model_source("decentrain-tests/no-such-model", "model.pretrained", lambda r: asked.append(r) or problem)
    assert asked == ["decentrain-tests/no-such-model"]
    check_model_source("decentrain-tests/no-such-model", "model.pretrained", lambda r: None)  # the hub knows it: fine


def test_existing_dir_and_byte_tokenizer_pass_and_a_file_fails(tmp_path):
    check_model_source(str(tmp_path), "model.pretrained", _never_called)
    check_model_source("byt5", "model.tokenizer", _never_called)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        check_model_source(str(tmp_path / "weights.bin"), "model.pretrained", _never_called)


def _raw(**sections):
    raw = {
        "algorithm": {"name": "ddp"},
        "train": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 4},
        "launcher": {"nproc_per_node": 2},
    }
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    return raw


def test_validate_refuses_a_missing_pretrained_dir(tmp_path):
    cfg = config_from_dict(_raw(model={"pretrained": str(tmp_path / "nope")}))
    with pytest.raises(ValueError, match="model.pretrained=.*no such directory"):
        validate(cfg, world_size=2)


def test_missing_data_file_is_named_with_a_close_match(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("text\n")
    cfg = config_from_dict(
        _raw(data={"source": "hf", "hf_path": "text", "domains": ["hf"], "hf_data_files": ["corpus.tx"]})
    )
    with pytest.raises(ValueError, match=r"^data.hf_data_files: corpus.tx matches no file; did you mean corpus.txt"):
        validate(cfg, world_size=2)


def test_a_text_file_too_short_for_one_block_fails_at_config_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.txt").write_text("hello world\nsecond line\n")
    cfg = config_from_dict(
        _raw(data={"source": "hf", "hf_path": "text", "domains": ["hf"], "hf_data_files": ["two.txt"]})
    )
    with pytest.raises(ValueError, match="too few for train/val/test splits"):
        validate(cfg, world_size=2)


def test_offline_corpus_too_small_names_the_knob():
    cfg = config_from_dict(_raw(data={"max_bytes_per_domain": 100}))
    with pytest.raises(ValueError, match="data.max_bytes_per_domain"):
        validate(cfg, world_size=2)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train.stepz=10"], "train.stepz is not a config key; did you mean train.steps"),
        (["trian.steps=3"], "trian.steps is not a config key; did you mean train"),
        (
            ["algorithm=diloco", "algorithm.outer_lr=0.3"],
            "algorithm.outer_lr was removed; use algorithm.outer_optimizer.lr",
        ),
        (["algorithm=noloco", "algorithm.inner_stepz=3"], "did you mean algorithm.inner_steps"),
        (["-m", "optim.lr=1e-3,2e-3", "optim.lrr=3"], "optim.lrr is not a config key"),
        (["algorithm=nolocco"], "algorithm=nolocco is not an option; did you mean noloco"),
        (["experiment=noloco_cpux"], "experiment=noloco_cpux is not an option; did you mean noloco_cpu"),
        (["algorithm=ddp,dilocco"], "algorithm=dilocco is not an option"),
    ],
)
def test_unknown_keys_and_options_name_close_matches(args, expected):
    problem = check_overrides(conf_dir(), "config", args)
    assert problem is not None and expected in problem
    assert "_schema" not in problem and "+" not in problem


@pytest.mark.parametrize(
    "args",
    [
        ["train.steps=10", "algorithm=noloco", "algorithm.inner_steps=3", "model=qwen2_tiny"],
        ["+train.extra_thing=1"],  # Hydra's explicit append: the user asked for it
        ["experiment=noloco_cpu", "launcher.nproc_per_node=2", "hydra.run.dir=x"],
        ["algorithm/outer_optimizer=heavy_ball", "algorithm=diloco"],
    ],
)
def test_good_overrides_pass(args):
    assert check_overrides(conf_dir(), "config", args) is None


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", "from decentrain.cli import main; main()", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_cli_unknown_key_is_one_stderr_line_and_exit_1(tmp_path):
    out = _cli("train.stepz=10", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("config error: train.stepz is not a config key; did you mean train.steps")


def test_cli_missing_checkpoint_is_one_stderr_line_before_any_worker(tmp_path):
    (tmp_path / "ckpt").mkdir()
    out = _cli("model.pretrained=ckpt/nope", "train.steps=1", cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]  # one line, no worker's traceback
    assert out.stderr.startswith("config error: model.pretrained=ckpt/nope: no such directory")
    assert not list(tmp_path.rglob("metrics.jsonl"))  # nothing trained
