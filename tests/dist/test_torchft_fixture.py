"""torchft's Streaming DiLoCo failure-recovery fixture, bit for bit, through decentrain's TorchFTDiLoCo.

Mirrors torchft diloco_regression_test.DiLoCoMockedUpdateTest.test_diloco_mocked_failure_recovery_0:
2 replica groups, H=6 in 2 fragments (τ=0, α=0), 1x1 weights of ones, every gradient 2, inner
SGD lr 1, outer SGD lr 2 (no momentum). Replica 1 dies right after its second committed sync
and restarts alone from the initial weights; at its first quorum it heals from replica 0
(weights, optimizer, the fragments' global weights and outer state, step) and both run on to
manager step 7. The run goes through the library's own path: TorchFTDiLoCo builds the manager
(build_manager, SafeHealHTTP), the fragments (model_fragments from `algorithm.fragments`)
and the outer optimizers (the registry's sgd), and heals through the trainer-state callbacks.
Each replica's parameters before every local step and its fragments' global weights at every
new manager step must equal torchft's fixture exactly.

The fixture is torchft's file (tests/dist/fixtures/, from meta-pytorch/torchft test_fixtures/ at
7eb7087), data only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytest.importorskip("torchft")

from decentrain.algorithms.diloco.streaming import StreamingDiLoCoConfig  # noqa: E402
from decentrain.algorithms.outer.optimizers import SGDConfig  # noqa: E402
from decentrain.algorithms.pretraining.torchft import FT_ALGORITHMS  # noqa: E402
from decentrain.algorithms.pretraining.transports.torchft_groups import TorchFTConfig  # noqa: E402
from decentrain.core.world import World  # noqa: E402
from decentrain.testing import InjectedFailure, lighthouse  # noqa: E402

pytestmark = pytest.mark.dist

FIXTURE = Path(__file__).parent / "fixtures" / "torchft_diloco_mocked_failure_recovery_0.json"
LAST_MANAGER_STEP = 7  # the fixture's loop ends at this committed step
FAIL_AT = {1: 2}  # replica -> the manager step after which its first attempt dies


class Weight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1, 1))


class Layers(nn.Module):
    """torchft's MockModel(in_dim=1, out_dim=1, n_layers=2): parameters layers.{0,1}.weight = [[1.0]]."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Weight(), Weight()])


def config() -> StreamingDiLoCoConfig:
    return StreamingDiLoCoConfig(
        inner_steps=6,
        num_fragments=2,
        overlap_steps=0,
        mix_alpha=0.0,
        fragments=[["layers.0.weight"], ["layers.1.weight"]],
        outer_optimizer=SGDConfig(lr=2.0, momentum=0.0, nesterov=False),
    )


def attempt(replica_id: int, lighthouse: str, fail_at: int | None) -> dict[str, Any]:
    """One run of a replica group's loop as torchft's MockDiLoCoTrainer.train_loop, on TorchFTDiLoCo."""
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    ft = TorchFTConfig(
        replicas=2, replica_id=replica_id, lighthouse=lighthouse, min_replicas=2, timeout_s=20, quorum_timeout_s=20
    )
    group = ft.replica_group(store_addr="localhost", store_port=store.port)
    algo = FT_ALGORITHMS.get("streaming_diloco")(config(), World(), group, 10**6)
    model = Layers()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)

    def load(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        algo.load_state_dict(state["algorithm"])

    algo.attach_trainer_state(
        lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "algorithm": algo.state_dict()}, load
    )
    algo.on_train_start(model, optimizer)
    history: dict[int, dict] = {}
    global_history: dict[int, dict] = {}
    seen: set[int] = set()
    local = 0
    try:
        while True:
            history[local] = {n: p.detach().tolist() for n, p in model.named_parameters()}
            step = algo.manager.current_step()
            if step == LAST_MANAGER_STEP:
                break
            if step not in seen:
                seen.add(step)
                global_history[local] = {
                    f"layers.{i}.weight": next(iter(f.original_parameters.values())).tolist()
                    for i, f in enumerate(algo.diloco._fragments)
                }  # noqa: SLF001
            for p in model.parameters():
                p.grad = torch.full_like(p, 2.0)
            optimizer.step()  # TorchFTDiLoCo's hooks: quorum, heal, fragment sync
            if algo.manager.current_step() == fail_at:
                raise InjectedFailure(f"replica {replica_id} at manager step {fail_at}")
            local += 1
    except BaseException:
        algo.manager.shutdown(wait=False)  # a dead group stops heartbeating
        raise
    algo.on_train_end(model)
    return {"history": history, "global_parameter_history": global_history}


def run_replica(replica_id: int, lighthouse: str) -> dict[str, Any]:
    fail_at = FAIL_AT.get(replica_id)
    try:
        return attempt(replica_id, lighthouse, fail_at)
    except InjectedFailure:
        return {**attempt(replica_id, lighthouse, None), "failed": True}  # restarted alone, from the initial weights


def test_streaming_diloco_failure_recovery_matches_torchft_fixture():
    from concurrent.futures import ThreadPoolExecutor

    with lighthouse(min_replicas=2) as lh, ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda r: run_replica(r, lh), range(2)))
    assert results[1].get("failed") and not results[0].get("failed")
    fixture = json.loads(FIXTURE.read_text())
    for replica, (expected, got) in enumerate(zip(fixture, results)):
        for key in ("history", "global_parameter_history"):
            want = {int(k): v for k, v in expected[0][key].items()}
            assert sorted(got[key]) == sorted(want), (replica, key)
            for local, params in want.items():
                for name, values in params.items():  # bit for bit: the fixture's values are exact in fp32
                    assert torch.equal(torch.tensor(got[key][local][name]), torch.tensor(values)), (
                        replica,
                        key,
                        local,
                        name,
                    )
