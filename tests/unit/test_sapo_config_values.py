"""Every hostile SAPO config value fails before start with one line `config error: <field>...`.

Issue 25: 16 of 42 hostile values got no clear line; six ran anyway (`optim.lr=inf`,
`sampling.temperature=nan`, `loss.epsilon=nan`, `exchange.hivemind.wait_s=nan`,
`exchange.hivemind.max_ttl_s=inf`, `payload.max_string_chars=1e12`) and ten raised a traceback
after the node had started (`optim.lr=nan`, NaN/inf task weights, bad `task_kwargs`, bad key
files). Each value goes through the recipe's own check (`recipes.rl.config_or_exit`) on the
composed Hydra config; two go end to end through `python -m recipes.rl`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from decentrain.testing import rerun_unprivileged
from recipes import conf_dir
from recipes.rl import config_or_exit

ROOT = Path(__file__).resolve().parents[2]
HIVEMIND = "exchange.hivemind"

# (override, the field the one line must name). Numbers across every section, NaN and inf included.
HOSTILE = [
    ("optim.lr=inf", "optim.lr"),
    ("optim.lr=nan", "optim.lr"),
    ("optim.lr=-1", "optim.lr"),
    ("optim.weight_decay=nan", "optim.weight_decay"),
    ("optim.betas=[0.9,1.5]", "optim.betas[1]"),
    ("optim.grad_clip=inf", "optim.grad_clip"),
    ("sampling.temperature=nan", "sampling.temperature"),
    ("sampling.temperature=inf", "sampling.temperature"),
    ("sampling.top_p=nan", "sampling.top_p"),
    ("sampling.max_new_tokens=0", "sampling.max_new_tokens"),
    ("sampling.top_k=-1", "sampling.top_k"),
    ("loss.epsilon=nan", "loss.epsilon"),
    ("loss.epsilon=-1", "loss.epsilon"),
    ("loss.epsilon_high=inf", "loss.epsilon_high"),
    ("loss.beta=nan", "loss.beta"),
    ("loss.spo_rho=nan", "loss.spo_rho"),
    ("loss.num_iterations=0", "loss.num_iterations"),
    ("batch.num_local=-1", "batch.num_local"),
    ("payload.max_string_chars=1000000000000", "payload.max_string_chars"),
    ("payload.max_age_s=nan", "payload.max_age_s"),
    ("payload.sender_budget_s=inf", "payload.sender_budget_s"),
    ("payload.mismatch_cost_s=nan", "payload.mismatch_cost_s"),
    ("payload.round_budget_s=inf", "payload.round_budget_s"),
    ("payload.max_bytes=0", "payload.max_bytes"),
    ("payload.ttl_rounds=-1", "payload.ttl_rounds"),
    (f"{HIVEMIND}.wait_s=nan", f"{HIVEMIND}.wait_s"),
    (f"{HIVEMIND}.max_ttl_s=inf", f"{HIVEMIND}.max_ttl_s"),
    (f"{HIVEMIND}.ttl_s=nan", f"{HIVEMIND}.ttl_s"),
    (f"{HIVEMIND}.rpc_timeout_s=inf", f"{HIVEMIND}.rpc_timeout_s"),
    (f"{HIVEMIND}.poll_s=0", f"{HIVEMIND}.poll_s"),
    (f"{HIVEMIND}.slow_rpc_s=nan", f"{HIVEMIND}.slow_rpc_s"),
    (f"{HIVEMIND}.max_fetch_bytes=0", f"{HIVEMIND}.max_fetch_bytes"),
    ("exchange.max_bytes=0", "exchange.max_bytes"),
    ("task.weights=[1,nan,1]", "task.weights[1]"),
    ("task.weights=[1,1,inf]", "task.weights[2]"),
    ("task.size=0", "task.size"),
    ("task.task_kwargs.chain_sum.min_terms=abc", "task.task_kwargs.chain_sum"),
    ("+task.task_kwargs.chain_sum.no_such_field=1", "task.task_kwargs.chain_sum"),
    ("task.task_kwargs.chain_sum.min_terms=9", "task.task_kwargs.chain_sum"),  # above max_terms
    ("train.rounds=0", "train.rounds"),
    ("train.seed=-1", "train.seed"),
    ("train.threads=0", "train.threads"),
    ("train.micro_batch_size=0", "train.micro_batch_size"),
    ("eval.every=-1", "eval.every"),
    ("eval.prompts_per_task=0", "eval.prompts_per_task"),
    ("reward.format_weight=nan", "reward.format_weight"),
    ("model.rope_theta=nan", "model.rope_theta"),
    ("model.hidden_size=0", "model.hidden_size"),
    ("logger.peak_flops=nan", "logger.peak_flops"),
    ("nodes=[{optim:{lr:nan}}]", "nodes[0].optim.lr"),
    ("nodes=[{sampling:{temperature:inf}}]", "nodes[0].sampling.temperature"),
]
KEY_FILES = ["short.key", "a_dir.key", "a_file/under_a_file.key"]  # 5 bytes; a directory; a file as parent


@pytest.fixture
def key_dir(tmp_path):
    (tmp_path / "short.key").write_bytes(b"12345")
    (tmp_path / "a_dir.key").mkdir()
    (tmp_path / "a_file").write_text("x")
    return tmp_path


def _config_error(overrides: list[str]) -> str:
    """The recipe's check on the composed config: its exit line (the test fails if the config passes)."""
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        dcfg = compose("rl", overrides=[*overrides, "run_dir=/nonexistent/never_created"])
    with pytest.raises(SystemExit) as e:
        config_or_exit(dcfg)
    return str(e.value.code)


@pytest.mark.parametrize("override, field", HOSTILE, ids=[o for o, _ in HOSTILE])
def test_hostile_value_fails_in_one_line_naming_its_field(override, field):
    line = _config_error([override])
    assert line.startswith(f"config error: {field}") and "\n" not in line, line


@pytest.mark.parametrize("name", KEY_FILES)
def test_bad_key_file_fails_in_one_line_before_start(key_dir, name):
    line = _config_error(["sapo=hivemind", f"key_file={key_dir / name}"])  # one node: no {node} needed
    assert line.startswith("config error: key_file=") and "\n" not in line, line


def test_unreadable_key_file_fails_before_start(key_dir):
    """Root reads a mode-000 file anyway; an ordinary user (test_as_an_ordinary_user) must not get past the check."""
    key = key_dir / "locked.key"
    key.write_bytes(bytes(32))
    key.chmod(0)
    if os.access(key, os.R_OK):  # root: readable, a valid key
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            dcfg = compose("rl", overrides=["sapo=hivemind", f"key_file={key}", "run_dir=/tmp/unused"])
        assert config_or_exit(dcfg).key_file == str(key)
    else:
        line = _config_error(["sapo=hivemind", f"key_file={key}"])
        assert line.startswith("config error: key_file=") and "cannot be read" in line and "\n" not in line, line


def test_as_an_ordinary_user():
    rerun_unprivileged(__file__, "key_file")


def test_a_good_config_passes_and_a_new_key_file_may_be_created(tmp_path):
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        dcfg = compose("rl", overrides=[f"key_file='{tmp_path}/keys/{{node}}.key'", "run_dir=/tmp/unused"])
    cfg = config_or_exit(dcfg)
    assert cfg.optim.lr > 0 and not (tmp_path / "keys").exists()  # checking creates nothing


@pytest.mark.parametrize(
    "override, field", [("optim.lr=nan", "optim.lr"), (f"{HIVEMIND}.max_ttl_s=inf", f"{HIVEMIND}.max_ttl_s")]
)
def test_recipe_exits_with_one_line_and_starts_nothing(tmp_path, override, field):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recipes.rl", "sapo=hivemind", override, f"run_dir={run_dir}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith(f"config error: {field}="), proc.stderr
    assert not run_dir.exists()  # no node, no run dir, no DHT
