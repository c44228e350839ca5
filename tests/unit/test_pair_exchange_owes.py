"""When a partner counts as owing: rounds it has not delivered, or two rounds of our sends it has not
taken. Read from the send works themselves, never from whether a round's helper thread is still alive:
under tests/stress.sh a thread whose sends had completed stayed alive (waiting for the GIL) across a
round, two such threads made rank 2 skip round 3 of a healthy 4-rank duplex exchange, and its
partner skipped with it (test_gossip_exchange_4ranks.py::test_full_duplex_..._every_round)."""

import threading

from decentrain.core.comm.pair_exchange import PairExchange, _Inbox
from decentrain.core.world import World


class _Work:
    def __init__(self, done: bool):
        self.done = done

    def is_completed(self) -> bool:
        return self.done


def _lingering_round(peer: int, sends_done: bool, release: threading.Event) -> _Inbox:
    """A round the partner delivered, whose thread is still alive (it waits on `release`)."""
    ib = _Inbox(peer, sends=[_Work(sends_done), _Work(sends_done)])
    ib.received.set()
    ib.thread = threading.Thread(target=release.wait, daemon=True)
    ib.thread.start()
    return ib


def test_threads_still_alive_after_their_sends_completed_are_not_a_debt():
    release = threading.Event()
    try:
        ex = PairExchange(World(rank=0, world_size=4))
        ex._pending = [_lingering_round(1, True, release), _lingering_round(1, True, release)]
        assert not ex._owes(1)  # before: two live threads for partner 1 made it owe
    finally:
        release.set()


def test_two_rounds_of_sends_the_partner_has_not_taken_are_a_debt():
    release = threading.Event()
    try:
        ex = PairExchange(World(rank=0, world_size=4), deadline_s=0.1)  # what a non-reader costs, once
        ex._pending = [_lingering_round(1, False, release), _lingering_round(1, True, release)]
        assert not ex._owes(1)  # one round in flight to a slow reader: still contacted
        ex._pending.append(_lingering_round(1, False, release))
        assert ex._owes(1) and not ex._owes(2)  # two untaken: partner 1 skipped, bounding our buffers
        assert ex._pending[0].overdue and ex._owes(1)  # known now: not waited for again
        undelivered = _Inbox(2, sends=[_Work(True)])
        undelivered.thread = threading.Thread(target=release.wait, daemon=True)
        undelivered.thread.start()
        ex._pending.append(undelivered)
        assert ex._owes(2)  # a round partner 2 never delivered
    finally:
        release.set()


class _GlooSend:
    """A gloo send work: completed only once someone wait()ed on it, however long ago the partner took it
    (torch 2.13's ProcessGroupGloo: is_completed() stays False until wait())."""

    def __init__(self, asked: threading.Event):
        self.asked, self.done = asked, False

    def is_completed(self) -> bool:
        done = self.done
        self.asked.set()
        return done

    def wait(self) -> None:
        self.done = True


def _round_whose_thread_lags(peer: int) -> _Inbox:
    """A round the partner delivered and took our sends of, whose helper thread gets the CPU (to wait() on them)
    only once the main thread has looked: a thread a round behind on a busy box, made so by an event."""
    asked = threading.Event()
    ib = _Inbox(peer, sends=[_GlooSend(asked)])
    ib.received.set()

    def run() -> None:
        asked.wait()
        for w in ib.sends:
            w.wait()

    ib.thread = threading.Thread(target=run, daemon=True)
    ib.thread.start()
    return ib


def test_sends_a_lagging_thread_has_not_waited_on_yet_are_not_a_debt():
    ex = PairExchange(World(rank=0, world_size=4), deadline_s=60.0)
    ex._pending = [_round_whose_thread_lags(1), _round_whose_thread_lags(1)]
    assert not ex._owes(1)  # before: both looked untaken, and a healthy partner's round was skipped
    assert not ex._pending[0].overdue
