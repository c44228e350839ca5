"""Golden trajectories of decentrain's own algorithms: a few steps on a tiny model, bit-exact on CPU.

Each run's per-step losses and final-parameter checksum are checked against tests/unit/fixtures/golden/,
so a change to any equation, to the loop or to the data order shows up as a diff of numbers. After an
intended change, regenerate them all (and commit the JSON) with

    WRITE_FIXTURES=1 python -m pytest -q -p no:cacheprovider tests/unit/test_golden_trajectories.py

Pre-training algorithms run as in-process replicas (threads, the library's own Trainer and transport);
SAPO as one silo node (generation, rewards, the GRPO step).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decentrain.testing import check_fixture
from decentrain.testing.fixtures import trajectory

FIXTURES = Path(__file__).parent / "fixtures" / "golden"
CORPUS = FIXTURES / "corpus.txt"  # the Apache License 2.0's text (/usr/share/common-licenses/Apache-2.0)
REGENERATE = "WRITE_FIXTURES=1 python -m pytest -q -p no:cacheprovider tests/unit/test_golden_trajectories.py"
STEPS = 8
PRETRAINING = {  # 2 or 4 outer rounds in 8 steps; no deadlines or stall rules: nothing may depend on time
    "noloco": ({"name": "noloco", "inner_steps": 2, "pairing_seed": 0, "stall_s": None, "deadline_s": None}, 4),
    "diloco": ({"name": "diloco", "inner_steps": 2}, 2),
    "streaming_diloco": ({"name": "streaming_diloco", "inner_steps": 4, "num_fragments": 2, "overlap_steps": 1}, 2),
    "sparseloco": ({"name": "sparseloco", "inner_steps": 2, "chunk_size": 64, "topk": 8}, 2),
}


@pytest.fixture
def golden_text(monkeypatch):
    """The goldens' text domain, read from the repo: the offline corpus's domains read what the box has
    installed (/usr/share/doc, /usr/include), and a package installed or removed would move every number."""
    from decentrain.data.corpus import DOMAINS

    text = CORPUS.read_text(encoding="utf-8")
    monkeypatch.setitem(DOMAINS._entries, "golden_text", lambda max_bytes, seed: [text[:max_bytes]])


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels on every run, whatever the box
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _pretraining_cfg(algorithm: dict):
    from decentrain.config import config_from_dict

    return config_from_dict(
        {
            "algorithm": algorithm,
            "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["golden_text"]},
            "train": {
                "steps": STEPS,
                "global_batch_size": 8,
                "micro_batch_size": 1,
                "eval_every": 100,
                "eval_batches": 1,
                "checkpoint_every": 100,
                "threads": 1,
                "seed": 0,
            },
            "logger": {"progress": False, "console": False, "log_every": 1, "all_ranks": True},
        }
    )


def _losses(run_dir: Path, rank: int) -> list[float]:
    from decentrain.core.metrics import metrics_file
    from decentrain.testing import metrics

    rows = metrics(run_dir, metrics_file(rank))
    return [r["train/loss"] for r in rows if "train/loss" in r]


@pytest.mark.parametrize("algo", list(PRETRAINING))
def test_pretraining_trajectory_matches_the_golden_one(algo, tmp_path, one_thread, golden_text):
    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process

    algorithm, world_size = PRETRAINING[algo]
    runs = run_replicas_in_process(_pretraining_cfg(algorithm), world_size, tmp_path)
    for rank, run in enumerate(runs):
        assert run.result.final_step == STEPS
        losses = _losses(tmp_path, rank)
        assert len(losses) == STEPS, losses
        check_fixture(
            FIXTURES / f"{algo}_rank{rank}.json",
            trajectory(losses, run.weights, world_size=world_size),
            command=REGENERATE,
        )


def test_sapo_trajectory_matches_the_golden_one(tmp_path, one_thread):
    from safetensors.torch import load_file

    from decentrain.algorithms.sapo.rounds import run_sapo
    from decentrain.core.world import World
    from decentrain.tasks import RewardConfig
    from decentrain.testing import tiny_sapo_config

    cfg = tiny_sapo_config(rounds=3, reward=RewardConfig(format_weight=0.5))  # format reward: groups of mixed rewards
    cfg.sampling.top_k = 50  # the untrained model then writes some well-formed completions, and a round trains
    rows = []
    run_sapo(cfg, World(), tmp_path, on_round=lambda node, m: rows.append(m))
    assert len(rows) == 3 and any(m["trained_completions"] > 0 for m in rows), rows  # a policy step was taken
    weights = load_file(str(tmp_path / "node0" / "final" / "model.safetensors"))
    losses = [float(m["loss"]) for m in rows]
    rewards = [float(m["reward"]) for m in rows]
    trained = [int(m["trained_completions"]) for m in rows]
    check_fixture(
        FIXTURES / "sapo_silo.json",
        trajectory(losses, weights, rewards=rewards, trained_completions=trained),
        command=REGENERATE,
    )
