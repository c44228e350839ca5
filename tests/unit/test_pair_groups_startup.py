"""A rank that dies during start-up (after its heartbeat began, before its pair groups met) must not hold the others.

At the old code every rank walked its pair rendezvous in order, each blocking up to `timeout_s` (600 s): a rank
killed mid start-up left the survivors waiting in `connect_all` and then raising (the local Slurm test's node-1 step
killed early: its peer on node 0 never trained). Ranks here are threads of one process over one TCPStore.
"""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from decentrain.core.comm.membership import Membership
from decentrain.core.comm.pair_groups import PairGroups
from decentrain.testing.processes import free_port


def _store(port: int, master: bool = False) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=master, wait_for_workers=False, timeout=timedelta(seconds=60))


@pytest.mark.timeout(120)
def test_start_up_meets_the_live_ranks_and_leaves_one_that_died_after_its_heartbeat():
    port = free_port()
    server = _store(port, master=True)
    dead = 2
    server.add(f"hb/{dead}", 3)  # rank 2 started beating, then died before it met anyone: its counter stays put
    built: dict[int, PairGroups] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            m = Membership(_store(port), r, 3, 0, interval_s=0.05).start_heartbeat()
            groups = PairGroups(lambda: _store(port), r, 0, timeout_s=600)  # the default rendezvous timeout
            built[r] = groups.connect_all(3, gone=lambda p: m.stopped(p, 0.5), poll_s=0.05)
            pg, other = groups.get(1 - r, 0)  # the live pair works
            t = torch.tensor([float(r + 1)])
            pg.allreduce([t]).wait()
            assert t.item() == 3.0
            m.stop()
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "connect_all waited on the dead rank"
    assert not errors, errors
    assert set(built) == {0, 1}
    for g in built.values():
        assert (dead, 0) not in g._groups  # never met; its rendezvous is left to time out in its own thread


def test_a_peer_that_has_not_beaten_yet_is_starting_not_stopped():
    store = dist.HashStore()
    m = Membership(store, 0, 3, 0)
    assert not m.stopped(1, 0.0) and not m.stopped(1, 0.0)  # no heartbeat yet: still starting, wait for it
    store.add("hb/2", 1)
    assert not m.stopped(2, 0.0)  # first look: nothing to compare with
    assert m.stopped(2, 0.0)  # began and did not move since
    store.add("hb/2", 1)
    assert not m.stopped(2, 0.0)  # it moved: alive
