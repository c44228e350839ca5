"""transport=torchft with DDP: torchft's ManagerIntegTest scenarios on decentrain's TorchFTDDP.

Replica groups are threads of this process (as in torchft's tests), joined by a real
LighthouseServer; each group's loop goes through TorchFTDDP's hooks and the trainer-state
callbacks, the heal state over SafeHealHTTP.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch

pytest.importorskip("torchft")

from decentrain.algorithms.ddp.ddp import DDPConfig  # noqa: E402
from decentrain.testing import Events, Replica, lighthouse, run_replicas  # noqa: E402

pytestmark = pytest.mark.dist


def assert_equal_states(results) -> None:
    first = results[0][0]["model"]
    for group in results:
        for rank in group:
            torch.testing.assert_close(rank["model"], first, rtol=0, atol=0)


def test_ddp_healthy_equal_every_step():
    """Mirrors torchft manager_integ_test.test_ddp_healthy: two groups, weights equal after every step."""
    seen: dict[tuple[int, int], dict] = {}

    def record(replica, rank, step, trainer):
        seen[(replica, step)] = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    with lighthouse() as lh:
        results = run_replicas([Replica(i, lh, DDPConfig(), steps=4, record=record) for i in range(2)])
    assert_equal_states(results)
    for step in range(1, 5):
        torch.testing.assert_close(seen[(0, step)], seen[(1, step)], rtol=0, atol=0)
    assert all(r[0]["manager_step"] == 4 for r in results)


def test_ddp_recovery_heals_from_live_peer():
    """Mirrors torchft manager_integ_test.test_ddp_recovery: group 1 dies after step 2, restarts from other
    initial weights, heals (weights, AdamW, sampler position, step) and ends bit-equal to group 0."""
    events = Events(fail_at={(0, 2)})
    with lighthouse() as lh:
        results = run_replicas(
            [Replica(0, lh, DDPConfig(), steps=5), Replica(1, lh, DDPConfig(), steps=5, events=events)]
        )
    assert events.counts["failure"] == 1
    assert_equal_states(results)
    assert (
        results[0][0]["position"] == results[1][0]["position"] == 5
    )  # the healed group read on from the peer's position
    assert results[1][0]["step"] == 5 and results[1][0]["algorithm"].dropped_steps == 0
    assert results[0][0]["algorithm"].dropped_steps == 0  # the survivor lost no step


def test_ddp_recovery_multi_rank():
    """Mirrors torchft manager_integ_test.test_ddp_recovery_multi_rank: both ranks of group 1 fail at step 2;
    the two-rank group (intra-group mean, then across groups) heals rank by rank from group 0."""
    events = Events(fail_at={(0, 2), (1, 2)})
    with lighthouse() as lh:
        results = run_replicas(
            [
                Replica(0, lh, DDPConfig(), steps=4, world_size=2),
                Replica(1, lh, DDPConfig(), steps=4, world_size=2, events=events),
            ]
        )
    assert events.counts["failure"] == 2
    assert_equal_states(results)
    for r in range(2):  # the two ranks of a group hold the same weights (intra-group mean)
        torch.testing.assert_close(results[0][r]["model"], results[1][r]["model"], rtol=0, atol=0)


def test_ddp_survivor_goes_on_alone():
    """A group that never comes back (lighthouse min_replicas=1): the survivor forms the next quorum
    without it once its heartbeat stops, loses no committed step and trains to the end."""
    events = Events(fail_at={(0, 2)})
    with lighthouse(min_replicas=1) as lh:
        results = run_replicas(
            [
                Replica(0, lh, DDPConfig(), steps=6),
                Replica(1, lh, DDPConfig(), steps=6, events=events, attempts=1, give_up=True),
            ]
        )
    survivor = results[0][0]
    assert results[1] == []  # group 1 is gone for good
    assert survivor["step"] == 6 and survivor["algorithm"].dropped_steps <= 1
    assert survivor["manager_step"] >= 5


def test_quorum_timeout_raises_at_the_calls_timeout():
    """Mirrors torchft manager_integ_test.test_quorum_timeout: no quorum (min_replicas=2, one group)
    raises TimeoutError at the call's timeout (0.01 s), not the manager's (quorum_timeout_s), from
    decentrain's build_manager. The bound is a sixth of the manager's timeout, not torchft's one
    second: a loaded box may stall the raising thread for seconds, never for 10."""
    import torch.distributed as dist

    from decentrain.algorithms.pretraining.torchft import build_manager
    from decentrain.algorithms.pretraining.transports.torchft_groups import TorchFTConfig
    from decentrain.core.world import World

    with lighthouse(min_replicas=2) as lh:
        store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
        ft = TorchFTConfig(replicas=2, replica_id=0, lighthouse=lh, min_replicas=2, quorum_timeout_s=60.0)
        group = ft.replica_group(store_addr="localhost", store_port=store.port)
        manager = build_manager(World(), group, lambda: {}, lambda s: None)
        try:
            start = time.monotonic()
            with pytest.raises(TimeoutError, match="Timeout expired"):
                manager.start_quorum(timeout=timedelta(seconds=0.01))
            assert time.monotonic() - start < group.quorum_timeout_s / 6
        finally:
            manager.shutdown(wait=False)
