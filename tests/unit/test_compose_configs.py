"""Every shipped Hydra config composes (and, for the training config, converts and validates)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import recipes.compare
import recipes.dei
import recipes.hdee_merge
import recipes.hdee_train  # noqa: F401  (each recipe registers its schemas on import)
import recipes.rl
import recipes.sft  # noqa: F401
import recipes.train  # noqa: F401
from decentrain.algorithms.hdee.config import hdee_config_from_dict
from decentrain.config import config_from_dict

# each primary config and the one conversion its recipe applies
CONVERTERS = {
    "compare": recipes.compare.to_config,
    "dei": recipes.dei.to_config,
    "config": lambda cfg: config_from_dict(OmegaConf.to_container(cfg, resolve=True)),
    "hdee": lambda cfg: hdee_config_from_dict(OmegaConf.to_container(cfg, resolve=True)),
    "hdee_merge": recipes.hdee_merge.to_config,
    "rl": recipes.rl.to_config,
    "sft": lambda cfg: OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(recipes.sft.SFTConfig), OmegaConf.to_container(cfg, resolve=True))
    ),
}

CONF = Path(__file__).resolve().parents[2] / "conf"
TRAIN_GROUPS = [
    d.name
    for d in CONF.iterdir()
    if d.is_dir() and d.name != "hydra" and (CONF / "config.yaml").read_text().count(f"- {d.name}:")
]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides: list[str], name: str = "config"):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=name, overrides=overrides, return_hydra_config=False)


# engine.name -> the optional package that engine needs (its config refuses to validate without it)
ENGINE_EXTRAS = {"deepspeed": "deepspeed"}
# options with a value the user must give (no default can be right): composed with one, refused without
REQUIRED = {("launcher", "hosts"): ["launcher.store=127.0.0.1:29400", "launcher.job_id=job1"]}


@pytest.mark.parametrize("group,option", [(g, o) for g in TRAIN_GROUPS for o in _options(g)])
def test_training_group_option_composes_and_converts(group, option):
    required = REQUIRED.get((group, option), [])
    if required:
        with pytest.raises(ValueError, match=required[0].split("=")[0]):
            config_from_dict(OmegaConf.to_container(_compose([f"{group}={option}", "run_dir=/tmp/x"]), resolve=True))
    cfg = _compose([f"{group}={option}", "run_dir=/tmp/x", *required])
    if cfg.engine.name in ENGINE_EXTRAS:  # e.g. engine=deepspeed_zero2, experiment=noloco_zero2_cpu
        pytest.importorskip(ENGINE_EXTRAS[cfg.engine.name])
    config_from_dict(OmegaConf.to_container(cfg, resolve=True))


def test_an_engine_without_its_package_is_refused_at_config_time(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    cfg = _compose(["engine=deepspeed_zero2", "run_dir=/tmp/x"])
    with pytest.raises(ValueError, match="engine.name='deepspeed' needs the deepspeed package"):
        config_from_dict(OmegaConf.to_container(cfg, resolve=True))


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF.glob("*.yaml")))
def test_every_primary_config_composes_and_converts(name):
    assert name in CONVERTERS, f"conf/{name}.yaml has no converter in this test"
    text = (CONF / f"{name}.yaml").read_text()
    overrides = [f"{key}=/tmp/x" for key in ("run_dir", "ensemble_dir") if f"{key}:" in text]  # outside Hydra's run
    CONVERTERS[name](_compose(overrides, name=name))


def test_unknown_group_option_lists_the_available_ones():
    with pytest.raises(Exception, match="ddp"):
        _compose(["algorithm=nope"])


def test_slurm_sweep_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=["hydra/launcher=slurm", "run_dir=/tmp/x"], return_hydra_config=True
        )
    # defaults a CPU cluster accepts: ranks are tasks, no GPU asked, a modest request
    launcher = cfg.hydra.launcher
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.cpus_per_task, launcher.mem_gb) == (2, None, 1, 4)
    assert launcher._target_ == "hydra_plugins.decentrain_slurm.CheckedSlurmLauncher"
