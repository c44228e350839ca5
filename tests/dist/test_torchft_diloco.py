"""transport=torchft with DiLoCo / Streaming DiLoCo: torchft's LocalSGDIntegTest scenarios
on decentrain's TorchFTDiLoCo (torchft's DiLoCo on the trainer's AdamW, heal state over SafeHealHTTP).

Replica groups are threads joined by a real LighthouseServer, as in torchft's tests; "global state"
is each fragment's last synced weights (torchft's `original_parameters`), which every replica
must hold bit-equal after each sync.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchft")

from decentrain.algorithms.diloco.diloco import DiLoCoConfig  # noqa: E402
from decentrain.algorithms.diloco.streaming import StreamingDiLoCoConfig  # noqa: E402
from decentrain.algorithms.outer.optimizers import SGDConfig
from decentrain.testing import FRAGMENTS, Events, Replica, diloco_global_state, lighthouse, run_replicas  # noqa: E402

pytestmark = pytest.mark.dist


def streaming(tau: int = 1, alpha: float = 0.5) -> StreamingDiLoCoConfig:
    return StreamingDiLoCoConfig(
        inner_steps=4, num_fragments=2, overlap_steps=tau, mix_alpha=alpha, fragments=FRAGMENTS
    )


def assert_equal_global(results) -> None:
    states = [diloco_global_state(g[0]["algorithm"]) for g in results]
    for s in states[1:]:
        torch.testing.assert_close(s, states[0], rtol=0, atol=0)


def record_syncs(seen: dict):
    def record(replica, rank, step, trainer):
        algo = trainer.algorithm
        seen.setdefault(replica, {})[algo.manager.current_step()] = diloco_global_state(algo)

    return record


def assert_equal_after_every_sync(seen: dict, replicas=(0, 1), first: int = 1) -> None:
    common = set.intersection(*(set(seen[r]) for r in replicas)) - set(range(first))
    assert common, seen.keys()
    for sync in sorted(common):
        for r in replicas[1:]:
            torch.testing.assert_close(seen[r][sync], seen[replicas[0]][sync], rtol=0, atol=0)


def test_diloco_healthy_global_state_equal_every_sync():
    """Mirrors torchft local_sgd_integ_test.test_diloco_healthy: H=2, three syncs, global state equal after each."""
    seen: dict = {}
    cfg = DiLoCoConfig(inner_steps=2, outer_optimizer=SGDConfig(lr=0.7, momentum=0.9, nesterov=True))
    with lighthouse() as lh:
        results = run_replicas([Replica(i, lh, cfg, steps=6, record=record_syncs(seen)) for i in range(2)])
    assert_equal_global(results)
    assert_equal_after_every_sync(seen)
    assert all(g[0]["manager_step"] == 3 for g in results)
    sums = [g[0]["algorithm"].after_optimizer_step(6, None, None)["ft/global_sum"] for g in results]
    assert (
        sums[0]
        == sums[1]
        == float(sum(t.double().sum() for t in diloco_global_state(results[0][0]["algorithm"]).values()))
    )
    torch.testing.assert_close(results[0][0]["model"], results[1][0]["model"], rtol=0, atol=0)  # synced last step


def test_diloco_recovery_heals_outer_state():
    """Mirrors torchft local_sgd_integ_test.test_diloco_recovery: group 1 dies mid-window (step 3 of H=2 x 4),
    restarts from other weights, heals at its first sync (weights, AdamW, outer Nesterov state, global
    weights, step, sampler), contributes to that very sync (both groups in its quorum), and from then on
    holds global state bit-equal to group 0's after every sync, and the same weights at the end."""
    events = Events(fail_at={(0, 3)})
    cfg = DiLoCoConfig(inner_steps=2, outer_optimizer=SGDConfig(lr=0.7, momentum=0.9, nesterov=True))
    seen: dict = {}
    attempts: dict[int, list] = {}  # replica 1's rows per attempt: (manager step, participants)

    def record(replica, rank, step, trainer):
        record_syncs(seen)(replica, rank, step, trainer)
        if replica == 1:
            rows = attempts.setdefault(id(trainer), [])
            rows.append((trainer.algorithm.manager.current_step(), trainer.algorithm.manager.num_participants()))

    with lighthouse() as lh:
        results = run_replicas(
            [Replica(0, lh, cfg, steps=8, record=record), Replica(1, lh, cfg, steps=8, events=events, record=record)]
        )
    assert events.counts["failure"] == 1
    assert_equal_global(results)
    restarted = list(attempts.values())[-1]
    healed_at, participants = next((m, n) for m, n in restarted if n >= 1)  # its first quorum
    assert participants == 2  # it contributed to the sync it healed at: within one sync of being back
    assert_equal_after_every_sync(seen, first=healed_at)  # bit-equal global state after every sync since
    torch.testing.assert_close(results[0][0]["model"], results[1][0]["model"], rtol=0, atol=0)
    assert results[1][0]["step"] == 8 and results[1][0]["position"] == results[0][0]["position"]
    assert results[0][0]["algorithm"].failed_syncs == 0  # the survivor committed every sync


@pytest.mark.slow
def test_streaming_diloco_recovery_mid_fragment():
    """Mirrors torchft local_sgd_integ_test.test_streaming_diloco_recovery: two fragments, τ=1, α=0.5;
    group 1 dies between fragment syncs and heals at the next fragment's quorum."""
    events = Events(fail_at={(0, 3)})
    with lighthouse() as lh:
        results = run_replicas(
            [Replica(0, lh, streaming(), steps=8), Replica(1, lh, streaming(), steps=8, events=events)]
        )
    assert events.counts["failure"] == 1
    assert_equal_global(results)
    assert results[0][0]["algorithm"].failed_syncs == 0


@pytest.mark.slow
def test_streaming_diloco_upscale():
    """Mirrors torchft local_sgd_integ_test.test_streaming_diloco_upscale: a third group starts after the
    first two synced; it joins the next quorum, heals, and all three hold equal global state from then on."""
    import threading

    seen: dict = {}
    go, joined_in = threading.Event(), threading.Event()

    def record(replica, rank, step, trainer):
        record_syncs(seen)(replica, rank, step, trainer)
        if replica == 2:
            joined_in.set()  # heartbeating and training: the next quorum waits for it
        elif step == 4:  # after two fragment syncs the third group starts; the first two wait until it runs
            go.set()
            assert joined_in.wait(120)

    cfg = streaming(tau=0, alpha=0.0)
    with lighthouse(min_replicas=2) as lh:
        results = run_replicas([Replica(i, lh, cfg, steps=12, record=record) for i in range(3)], gates=[None, None, go])
    assert_equal_global(results)
    joined = min(seen[2])  # the first sync the late group took part in
    assert_equal_after_every_sync(seen, replicas=(0, 1, 2), first=joined)


def test_streaming_diloco_commit_failure_restores_fragment():
    """Mirrors torchft local_sgd_integ_test.test_streaming_diloco_commit_failure: an allreduce error on both
    groups at the first fragment sync fails the commit; the fragment goes back to its global weights,
    training goes on, and the groups end with equal global state."""
    events = [Events(fail_allreduce_at={(0, 2)}), Events(fail_allreduce_at={(0, 2)})]
    cfg = streaming(tau=0, alpha=0.0)
    with lighthouse() as lh:
        results = run_replicas([Replica(i, lh, cfg, steps=8, events=events[i]) for i in range(2)])
    for e in events:
        assert e.counts["allreduce_failure"] == 1
    for g in results:
        assert g[0]["algorithm"].failed_syncs == 1 and g[0]["step"] == 8
    assert_equal_global(results)


def test_streaming_diloco_whole_job_resume_is_exact(tmp_path):
    """Checkpoints stay for whole-job restarts: both groups save at step 5 (mid-window: fragment 1's local
    step is 1) through the Checkpointer, a fresh job (new lighthouse, managers, models and optimizers)
    loads them and trains on to step 8, ending bit-equal to an uninterrupted 8-step run."""
    from decentrain.core.checkpoint import Checkpointer

    cfg = streaming(tau=0, alpha=0.5)

    def run(steps: int, resume=None):
        with lighthouse() as lh:
            return run_replicas([Replica(i, lh, cfg, steps=steps, resume=resume and [resume[i]]) for i in range(2)])

    straight = run(8)
    first = run(5)
    saved = []
    for i, group in enumerate(first):  # through the disk format the Trainer's checkpoints use
        ckpt = Checkpointer(tmp_path / f"replica_{i}", 0, 1)
        ckpt.save(5, group[0]["state"])
        saved.append(ckpt.load(5))
    assert saved[0]["algorithm"]["local_step"] == 1
    resumed = run(8, resume=saved)
    for a, b in zip(straight, resumed):
        torch.testing.assert_close(b[0]["model"], a[0]["model"], rtol=0, atol=0)
        torch.testing.assert_close(
            diloco_global_state(b[0]["algorithm"]), diloco_global_state(a[0]["algorithm"]), rtol=0, atol=0
        )
        assert b[0]["manager_step"] == a[0]["manager_step"] and b[0]["position"] == a[0]["position"]
