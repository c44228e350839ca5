"""decentrain's test kit (as OLMo-core ships `olmo_core.testing`): what the suite, and a user's own
tests of a new algorithm or recipe, need to run code the way it runs for real.

    from decentrain.testing import run_ranks, run_recipe, lighthouse

- processes: `run_ranks` (N gloo ranks in fresh processes), `run_in_threads`, `run_in_fresh_process`, `free_port`,
  `start_store` (a job store on loopback)
- recipes: `run_recipe(module, *overrides)` (`python -m recipes.<name>` from the checkout), `run_train`
  (recipes.train on a tiny model), `recipe_killing_a_worker`, and readers of a run's metrics
- torchft: `lighthouse` (a LighthouseServer for a `with` block) and a torchft-style replica-group harness
- tiny: tiny SAPO / HDEE / Trainer configs (and FixedExchange, a SAPO node's fixed peer records)
- devices: `device_guard`, a CPU stand-in for NCCL's device checks; privilege: re-run a test as an
  ordinary user; slurm: a throwaway local Slurm cluster; dei: pMARS and a scripted warrior endpoint
- dht_attacks: the hostile DHT values and records of the swarm attack tests and `benchmarks.swarm_attack`
- fixtures: golden numbers written with WRITE_FIXTURES=1 and checked by every later run

Names load lazily (PEP 562): importing `free_port` does not import torchft, hivemind or the SAPO stack.
A support package: the library never imports it (tests/unit/test_layering.py checks).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "processes": ["free_port", "run_ranks", "run_in_fresh_process", "run_in_threads", "start_store"],
    "gossip": ["average"],
    "recipes": [
        "ROOT",
        "TINY",
        "TINY_RL",
        "metrics",
        "recipe_command",
        "recipe_env",
        "recipe_killing_a_worker",
        "run_recipe",
        "run_train",
        "train_losses",
        "worker_ready",
    ],
    "torchft": [
        "FRAGMENTS",
        "Events",
        "InjectedFailure",
        "MiniTrainer",
        "Replica",
        "TwoLayer",
        "diloco_global_state",
        "lighthouse",
        "run_replicas",
    ],
    "tiny": [
        "DOMAINS",
        "EASY_TASKS",
        "TINY_MODEL",
        "TRAINER_MODEL",
        "WIDTHS",
        "FixedExchange",
        "save_random_experts",
        "tiny_hdee_config",
        "tiny_sapo_config",
        "tiny_trainer",
    ],
    # not device_guard.py: a submodule named like the function would shadow it once imported
    "devices": ["DeviceMismatch", "GuardCalls", "TENSOR_OPS", "device_guard"],
    "privilege": ["UNPRIVILEGED_ENV", "rerun_unprivileged"],
    "slurm": ["LocalSlurm", "missing_requirements"],
    "dei": ["WarriorEndpoint", "pmars_or_skip"],
    "fixtures": ["check_fixture", "write_fixtures"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'decentrain.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"decentrain.testing.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
