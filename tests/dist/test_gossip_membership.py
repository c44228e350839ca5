"""Membership over the c10d store: a stopped or lagging NoLoCo partner costs at most one deadline.

At the old main every pairing with a lagging rank cost its partner the full deadline, and the
lagging rank, once awake, stayed rounds behind (out of the pairing) for the rest of the run.
"""

import os
import signal
import threading
import time

import pytest
import torch

from decentrain.algorithms.noloco.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.testing import run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]  # above run_ranks' 300 s

DEADLINE = 1.5
STEP_S = 0.08  # simulated compute per inner step


def _wake(store, after_s):
    while not store.check(["stopped_pid"]):  # poll: a blocking get would hold the store client's lock
        time.sleep(0.05)
    time.sleep(after_s)
    os.kill(int(store.get("stopped_pid")), signal.SIGCONT)


def _noloco_run(world, rounds, lagger, lag_round, lag_s, stop):
    """NoLoCo with H=1 on a tiny model; `lagger` sleeps (or is SIGSTOPped) for `lag_s` before `lag_round`."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # (old code: none)
    stall = {"stall_s": 0.8 if stop else None} if "stall_s" in NoLoCoConfig.__dataclass_fields__ else {}
    cfg = NoLoCoConfig(
        inner_steps=1,
        outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.5),
        deadline_s=DEADLINE,
        full_duplex=False,
        pairing_seed=5,
        **stall,
    )
    algo = NoLoCo(cfg, world)
    algo.on_train_start(model, opt)
    rows, start, step = [], time.perf_counter(), 0
    if stop and world.rank == 0:
        threading.Thread(target=_wake, args=(world.store, lag_s), daemon=True).start()
    while algo.round < rounds and not algo.should_stop(step, rounds):
        if world.rank == lagger and algo.round == lag_round and step == lag_round:
            if stop:  # a stopped process: its heartbeat thread stops too; rank 0 wakes it
                world.store.set("stopped_pid", str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)
            else:  # a slow one: alive (heartbeat moves) but rounds behind
                time.sleep(lag_s)
        with torch.no_grad():
            model.weight.add_(0.01 * (world.rank + 1))
        time.sleep(STEP_S)
        step += 1
        r = algo.round
        m = algo.after_optimizer_step(step, model, opt)
        rows.append((r, m["outer/partner_missed"], m.get("outer/rounds_jumped", 0)))
    st = algo.transport.stats
    algo.on_train_end(model)
    return rows, st.timeouts, getattr(st, "partner_skipped", 0), st.seconds, time.perf_counter() - start


def _check(results, lagger, rounds):
    survivors = [r for r in range(4) if r != lagger]
    skipped = sum(results[r][2] for r in survivors)
    assert skipped >= 1  # the other pairings with it were skipped, and counted
    for r in survivors:
        rows, timeouts, _, waited, _ = results[r]
        assert timeouts <= 1, f"rank {r} waited {timeouts} deadlines on the lagging rank: one at most"
        assert [row[0] for row in rows] == list(range(rounds))  # every round ran
        # one deadline on the lagging rank, plus at most about one more on a partner it held up
        assert waited < 2 * DEADLINE + 0.5, f"rank {r} waited {waited:.1f}s on partners (one deadline is {DEADLINE}s)"
    rows = results[lagger][0]
    jumps = [i for i, row in enumerate(rows) if row[2] > 0]
    assert jumps, "the lagging rank never caught up with the live round"
    after = rows[jumps[0] + 1 : jumps[0] + 3]  # back in the pairing within 2 rounds of waking
    assert any(missed == 0 for _, missed, _ in after), rows


def test_a_slow_partner_costs_at_most_one_deadline_and_the_lagging_rank_rejoins():
    rounds = 40
    results = run_ranks(_noloco_run, 4, rounds, 3, 4, 2.5, False, timeout=300)
    _check(results, 3, rounds)


def test_a_stopped_partner_is_given_up_on_by_heartbeat_before_the_deadline():
    rounds = 40
    results = run_ranks(_noloco_run, 4, rounds, 3, 4, 2.5, True, timeout=300)
    _check(results, 3, rounds)
    survivors = [0, 1, 2]
    assert sum(results[r][1] for r in survivors) == 0  # the stall (0.8s) was noticed before any 1.5s deadline


# -- issue 40: one bad write to the job store must not cost averaging rounds ---------------------------------

ROUNDS_ON_STORE, TARGET, ATTACK_S = 24, 1, 1.5


def _noloco_on_job_store(world, rounds):
    """NoLoCo (H=1, a tiny model) with every rank a client of a real job store; per rank: averaging rounds
    dropped, and the membership's counts of refused values. The deadline is far above any pause a loaded
    box makes and no heartbeat stall is acted on, so a round is dropped only when membership says a partner
    is gone or rounds behind (its published progress)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = NoLoCoConfig(
        inner_steps=1,
        outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.5),
        deadline_s=60.0,
        full_duplex=False,
        pairing_seed=5,
        stall_s=None,
    )
    algo = NoLoCo(cfg, world)
    algo.on_train_start(model, opt)
    dropped, step = 0, 0
    while algo.round < rounds and not algo.should_stop(step, rounds):
        with torch.no_grad():
            model.weight.add_(0.01 * (world.rank + 1))
        time.sleep(STEP_S)  # simulated compute: the run outlasts the attack
        step += 1
        dropped += int(algo.after_optimizer_step(step, model, opt).get("outer/partner_missed", 0))
    drops = dict(getattr(algo.transport.membership, "drops", {}))
    algo.on_train_end(model)
    return dropped, drops


def _write_x_while_training(addr, over, report):
    """Once every rank has done 2 rounds, write "x" at hb/<TARGET> for ATTACK_S seconds, then wait for the
    event that the target's heartbeat wrote a number again (its thread is alive)."""
    from decentrain.core.comm.job_store import connect
    from decentrain.core.world import shared_store_prefix

    store, ns, tick = connect(addr), f"{shared_store_prefix(0)}/job1", threading.Event()

    def value(key):
        return store.get(key) if store.check([key]) else None

    def done(r):
        raw = value(f"{ns}/progress/{r}")
        return int(raw.split(b",")[1]) if raw else -1

    while not over.is_set() and min(done(r) for r in range(4)) < 2:
        tick.wait(0.02)
    before, writes, end = value(f"{ns}/hb/{TARGET}"), 0, time.monotonic() + ATTACK_S
    while not over.is_set() and time.monotonic() < end:
        store.set(f"{ns}/hb/{TARGET}", "x")
        writes += 1
        tick.wait(0.005)
    report["during_run"] = not over.is_set() and all(not value(f"{ns}/progress/{r}").endswith(b",1") for r in range(4))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (report.get("recovered") or over.is_set()):
        raw = value(f"{ns}/hb/{TARGET}")
        report["recovered"] = raw is not None and raw.isdigit() and int(raw) > int(before or 0)
        tick.wait(0.02)
    report["writes"] = writes


def _run_on_job_store(tmp_path, attack):
    from decentrain.testing import start_store

    tmp_path.mkdir()
    store, addr = start_store(tmp_path)
    over, report = threading.Event(), {}
    attacker = threading.Thread(target=_write_x_while_training, args=(addr, over, report), daemon=True)
    try:
        if attack:
            attacker.start()
        results = run_ranks(_noloco_on_job_store, 4, ROUNDS_ON_STORE, timeout=300, store=addr)
    finally:
        over.set()
        if attack:
            attacker.join(30)
        store.kill()
    return results, report


def test_x_at_a_heartbeat_for_1_5_s_drops_no_more_averaging_rounds_than_the_control(tmp_path):
    """At 78c329b the target's heartbeat `add` met "x": the store server closed its connection, the heartbeat
    thread ended and the target's progress was never published again, so its partners skipped it as rounds
    behind for the rest of the run (and the run exited 0). Partners reading its heartbeat by `add` lost their
    connections too: tests/unit/test_membership_store.py."""
    control, _ = _run_on_job_store(tmp_path / "control", attack=False)
    attacked, report = _run_on_job_store(tmp_path / "attack", attack=True)
    assert report.get("writes", 0) > 0 and report.get("during_run"), f"the attack did not overlap the run: {report}"
    assert report.get("recovered"), f"rank {TARGET}'s heartbeat never wrote again after the attack: {report}"
    per_rank = [d for d, _ in attacked]
    assert sum(per_rank) <= sum(d for d, _ in control), (
        f"rounds dropped per rank under attack {per_rank}, control {[d for d, _ in control]}; "
        f"refused {[m for _, m in attacked]}"
    )


def test_x_at_a_heartbeat_as_an_ordinary_user_too():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "drops_no_more_averaging_rounds")
