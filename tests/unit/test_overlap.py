"""One-step-delayed (overlapped) outer updates, `algorithm.overlap=true` (outer/overlap.py):
the correction against hand-computed numbers, DiLoCo and NoLoCo on two in-process replicas
driven step by step, a late partner costing one round, and exact resume with a round in flight."""

from __future__ import annotations

import pytest
import torch

from decentrain.algorithms.diloco.diloco import DiLoCo, DiLoCoConfig
from decentrain.algorithms.noloco.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig, SGDConfig
from decentrain.algorithms.outer.overlap import delayed_correction_
from decentrain.core.comm.inprocess_transport import InProcessHub
from decentrain.core.world import World


def test_correction_moves_own_progress_onto_the_new_slow_weights():
    theta, phi, base = [torch.tensor([3.0, -1.0])], [torch.tensor([1.5, 0.0])], [torch.tensor([2.0, 1.0])]
    delayed_correction_(theta, phi, base)  # φ + (θ − b) = [1.5 + 1, 0 − 2]
    assert theta[0].tolist() == [2.5, -2.0] and base[0].tolist() == [2.5, -2.0]
    bf16 = [torch.tensor([3.0], dtype=torch.bfloat16)]
    delayed_correction_(bf16, [torch.tensor([1.5])], [torch.tensor([2.0], dtype=torch.bfloat16)])
    assert bf16[0].dtype == torch.bfloat16 and bf16[0].item() == 2.5


def test_overlap_is_checked_when_the_config_is_built():
    with pytest.raises(ValueError, match="algorithm.overlap=true .*adaptive_inner_steps=false"):
        DiLoCoConfig(overlap=True, adaptive_inner_steps=True)
    with pytest.raises(ValueError, match="algorithm.overlap=true"):
        NoLoCoConfig(overlap=True, adaptive_inner_steps=True)


def _pair(algo_cls, cfg, deadline_s=None):
    """Two replicas of a one-weight model (θ = 0) over one in-process hub, started."""
    hub = InProcessHub(2, deadline_s)
    out = []
    for rank in range(2):
        model = torch.nn.Linear(1, 1, bias=False)
        model.weight.data.zero_()
        algo = algo_cls(cfg, World(rank=rank, world_size=2))
        algo.transport = hub.transport(rank)
        algo.on_train_start(model, None)
        out.append((model, algo))
    return out


def _step(replicas, step, drifts=(1.0, 3.0)):
    """One inner step (replica i's weight moves by drifts[i]) and the hooks; the metrics of each."""
    for (model, _), d in zip(replicas, drifts):
        model.weight.data += d
    return [algo.after_optimizer_step(step, model, None) for model, algo in replicas]


def _weights(replicas):
    return [model.weight.item() for model, _ in replicas]


def test_diloco_overlap_lands_each_mean_one_round_late():
    # η = 1, no momentum: φ ← φ − mean Δ. Drifts +1 and +3 per step, H = 1.
    cfg = DiLoCoConfig(inner_steps=1, overlap=True, outer_optimizer=SGDConfig(lr=1.0, momentum=0.0, nesterov=False))
    reps = _pair(DiLoCo, cfg)
    _step(reps, 1)  # θ = (1, 3); nothing in flight; b = θ; sends Δ = φ − b = (−1, −3)
    assert _weights(reps) == [1.0, 3.0]
    _step(reps, 2)  # θ = (2, 6); lands mean Δ = −2: φ = 2; φ + (θ − b) = (2 + 1, 2 + 3)
    assert _weights(reps) == [3.0, 5.0] and reps[0][1].outer.slow[0].item() == 2.0
    _step(reps, 3)  # θ = (4, 8); φ = 4; (4 + (4 − 3), 8 + (4 − 5))
    assert _weights(reps) == [5.0, 7.0]
    for model, algo in reps:  # the last step: Δ = (4 − 5, 4 − 7) lands, φ = 6 = 3 steps of the mean drift 2
        algo.drain(model)
    assert _weights(reps) == [6.0, 6.0] and all(a.in_flight is None for _, a in reps)


def test_noloco_overlap_averages_with_the_partner_one_round_late():
    # NoLoCo's own step, η = 0.5, μ = 0: φ ← φ + 0.5·(θ̄ − φ). Drifts +1 and +3 per step, H = 1.
    cfg = NoLoCoConfig(inner_steps=1, overlap=True, outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.0))
    reps = _pair(NoLoCo, cfg)
    _step(reps, 1)  # θ = (1, 3); sends b = θ
    _step(reps, 2)  # θ = (2, 6); θ̄ = 2: φ = 1; φ + (θ − b) = (1 + 1, 1 + 3)
    assert _weights(reps) == [2.0, 4.0]
    _step(reps, 3)  # θ = (3, 7); θ̄ = 3: φ = 2; (3 + 0, 7 − 2)
    assert _weights(reps) == [3.0, 5.0]
    for model, algo in reps:  # θ̄ = 4: φ = 3 on both
        algo.drain(model)
    assert _weights(reps) == [3.0, 3.0]
    for model, algo in reps:
        algo.on_train_end(model)


def test_noloco_overlap_late_partner_costs_that_round_only():
    cfg = NoLoCoConfig(inner_steps=1, overlap=True, outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.0))
    reps = _pair(NoLoCo, cfg, deadline_s=5.0)
    late = reps[1][1].transport
    exchange = late.exchange

    def skip_round_zero(tensors, group, round_idx):  # replica 1 sends nothing in round 0
        if round_idx == 0:
            late.skip_round(group, round_idx)
            return None
        return exchange(tensors, group, round_idx)

    late.exchange = skip_round_zero
    _step(reps, 1)
    m = _step(reps, 2)  # round 0 lands alone: φ = 0.5·b = (0.5, 1.5); θ = (2 − 0.5, 6 − 1.5)
    assert [x["outer/partner_missed"] for x in m] == [1.0, 1.0]
    assert _weights(reps) == [1.5, 4.5]
    m = _step(reps, 3)  # θ = (2.5, 7.5); round 1 lands paired: θ̄ = 3, φ = (1.75, 2.25); θ = (2.75, 5.25)
    assert [x["outer/partner_missed"] for x in m] == [0.0, 0.0]
    assert _weights(reps) == [2.75, 5.25]
    for model, algo in reps:
        algo.drain(model)
        algo.on_train_end(model)


def _cfg(algo: str, **train):
    from decentrain.config import config_from_dict

    return config_from_dict(
        {
            "algorithm": {
                "name": algo,
                "inner_steps": 2,
                "overlap": True,
                **({"stall_s": None} if algo == "noloco" else {}),
            },
            "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
            "train": {
                "steps": 8,
                "global_batch_size": 2,
                "micro_batch_size": 1,
                "eval_every": 100,
                "eval_batches": 1,
                "checkpoint_every": 100,
                "threads": 1,
                **train,
            },
            "logger": {"progress": False, "console": False, "log_every": 1},
        }
    )


@pytest.mark.parametrize("algo", ["diloco", "noloco"])
def test_resume_with_a_round_in_flight_is_exact(tmp_path, algo):
    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        straight = run_replicas_in_process(_cfg(algo), 2, tmp_path / "straight")
        # stops at step 5: round 1 (sent at step 4) is in flight in the checkpoint and is sent again on resume
        run_replicas_in_process(_cfg(algo, stop_at=5), 2, tmp_path / "resumed")
        resumed = run_replicas_in_process(_cfg(algo), 2, tmp_path / "resumed")
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(straight, resumed):
        assert a.result.final_step == b.result.final_step == 8
        different = [k for k in a.weights if not torch.equal(a.weights[k], b.weights[k])]
        assert not different, f"{different[:3]} differ after resume"
    if algo == "diloco":  # the final step drained the last round: both replicas hold φ
        assert all(torch.equal(straight[0].weights[k], straight[1].weights[k]) for k in straight[0].weights)
