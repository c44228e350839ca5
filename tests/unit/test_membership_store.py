"""Membership that one bad write to the job's store cannot break (issue 40, item 3).

At 78c329b a rank bumped its heartbeat with `add(hb/<rank>, 1)` and read its peers' with
`add(hb/<peer>, 0)`. torch's store server parses an `add`'s old value as an integer and closes
the connection of a client whose value is not one: one "x" written at hb/<rank> cut off that
rank and every partner that looked at it. The heartbeat thread then ended, progress was never
published again, and partners skipped the rank as stopped. Gossip job numbers were counted with
`add(jobs/<rank>, 1)`, so a forged add split a rank from its job.

Ranks here are Membership objects over one real TCPStore server in this process; the attacker is
one more client. Every wait is on an event or a store value, bounded by a timeout.
"""

from __future__ import annotations

import inspect
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from decentrain.core.comm.membership import Membership, job_prefix
from decentrain.testing import rerun_unprivileged
from decentrain.testing.processes import free_port

pytestmark = pytest.mark.timeout(120)


def _server() -> tuple[dist.TCPStore, int]:
    port = free_port()
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)), port


def _client(port: int, timeout_s: float = 30) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))


def _until(cond, timeout_s: float = 20.0) -> bool:
    """True once `cond()` holds; False after `timeout_s` (polls the store: the event is a value there)."""
    end, tick = time.monotonic() + timeout_s, threading.Event()
    while not cond():
        if time.monotonic() > end:
            return False
        tick.wait(0.02)
    return True


def _count(store: dist.Store, key: str) -> int | None:
    raw = store.get(key) if store.check([key]) else None
    return int(raw) if raw is not None and raw.isdigit() else None


def test_a_non_integer_heartbeat_costs_the_reader_nothing_and_is_counted():
    server, port = _server()
    reader = Membership(_client(port), 0, 2, 0, authority=None)
    attacker = _client(port)
    attacker.set("hb/1", "x")
    assert reader.stalled_for(1) == 0.0 and not reader.stopped(1, 0.0)  # unknown: no evidence of a stall
    reader.publish(3)  # the reader's connection still works
    assert reader.progress(0) is not None and reader.progress(0).done == 3
    assert reader.drops["hb"] == 2  # both reads of "x" counted
    del server


def test_the_heartbeat_overwrites_a_non_integer_and_beats_on():
    server, port = _server()
    m = Membership(_client(port), 1, 2, 0, interval_s=0.05, authority=None).start_heartbeat()
    attacker = _client(port)
    try:
        for _ in range(3):  # "x" three times, each until the heartbeat has written a number again
            attacker.set("hb/1", "x")
            assert _until(lambda: _count(attacker, "hb/1") is not None), "the heartbeat stopped after a non-integer"
        before = _count(attacker, "hb/1")
        assert _until(lambda: (_count(attacker, "hb/1") or 0) > before)  # and it still moves
        m.publish(5)
        assert m.progress(1).done == 5
    finally:
        m.stop()
    del server


class _Flaky:
    """A store whose next write raises an error the store never raises (a bug anywhere below the heartbeat)."""

    def __init__(self, store: dist.Store):
        self.store, self.fail = store, threading.Event()

    def _maybe_fail(self) -> None:
        if self.fail.is_set():
            self.fail.clear()
            raise KeyError("injected")

    def set(self, key, value):
        self._maybe_fail()
        return self.store.set(key, value)

    def add(self, key, value):  # 78c329b's heartbeat wrote with add
        self._maybe_fail()
        return self.store.add(key, value)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_the_heartbeat_thread_survives_an_exception():
    server, port = _server()
    flaky = _Flaky(_client(port))
    m = Membership(flaky, 1, 2, 0, interval_s=0.05, authority=None).start_heartbeat()
    watcher = _client(port)
    try:
        assert _until(lambda: _count(watcher, "hb/1") is not None)
        flaky.fail.set()
        assert _until(lambda: not flaky.fail.is_set())  # the heartbeat met the error
        after = _count(watcher, "hb/1")
        assert _until(lambda: (_count(watcher, "hb/1") or 0) > after), "the heartbeat thread ended on an exception"
    finally:
        m.stop()
    del server


def test_a_lost_store_connection_is_reopened_and_the_heartbeat_goes_on():
    server, port = _server()
    first = _client(port)
    opened = []

    def reconnect():
        opened.append(_client(port, timeout_s=5))
        return opened[-1], opened[-1]

    m = Membership(first, 1, 2, 0, interval_s=0.05, authority=None, reconnect=reconnect).start_heartbeat()
    watcher = _client(port)
    try:
        first.set("poison", "x")
        with pytest.raises(RuntimeError):
            first.add("poison", 1)  # the server closes this client's connection: every later call on it fails
        assert m.wait_beats(m.beats + 3, 20) and m.reconnects == 1 and len(opened) == 1
        before = _count(watcher, "hb/1")
        assert _until(lambda: (_count(watcher, "hb/1") or 0) > before)
        m.publish(7)
        assert m.progress(1).done == 7  # the training thread's calls use the new connection too
    finally:
        m.stop()
    del server


def _rank_store(base: dist.Store) -> dist.Store:
    return dist.PrefixStore("shared", base)  # one rank's client of the job's store


def test_a_forged_add_on_a_job_counter_splits_no_job():
    base = dist.HashStore()
    base.set_timeout(timedelta(seconds=5))
    _rank_store(base).add("jobs/1", 1)  # a store client, before rank 1 starts its first gossip job
    assert {job_prefix(_rank_store(base), r, 0) for r in range(4)} == {"job1"}


@pytest.mark.parametrize("forged", ["99", "x", "-1", "\u0661"])
def test_a_replacement_joins_the_job_most_ranks_published(forged):
    base = dist.HashStore()
    base.set_timeout(timedelta(seconds=5))
    for r in range(3):
        job_prefix(_rank_store(base), r, 0)
    _rank_store(base).set("jobs/3", forged)  # rank 3 died; a store client wrote its count
    world = {"world_size": 4} if "world_size" in inspect.signature(job_prefix).parameters else {}  # (78c329b: none)
    assert job_prefix(_rank_store(base), 3, 1, **world) == "job1"


def test_membership_store_attacks_fail_as_an_ordinary_user_too():
    rerun_unprivileged(__file__, "non_integer or exception or lost_store or forged_add or most_ranks")
