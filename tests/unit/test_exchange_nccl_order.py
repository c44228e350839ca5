"""NCCL creates a process group's communicator on its first point-to-point call, with a blocking
rendezvous of both ranks. With one group per direction, posting "receives first" made rank 0 start
on lane (1, 0) while rank 1 started on lane (0, 1): each waited for the other forever. No device here
has two GPUs, so a fake torch.distributed models exactly that blocking creation, with two ranks as
threads of this process."""

import threading

import pytest
import torch
import torch.distributed as dist

from decentrain.core.comm.pair_exchange import PairExchange
from decentrain.core.world import World
from decentrain.testing import run_in_threads


class _Group:
    def __init__(self, gid: int, ranks: list[int]):
        self.gid, self.ranks = gid, ranks


class _Recv:
    def __init__(self, fake: "LazyNcclFake", key: tuple, t: torch.Tensor):
        self.fake, self.key, self.t = fake, key, t

    def wait(self, timeout=None) -> bool:
        with self.fake.cond:
            if not self.fake.cond.wait_for(lambda: self.key in self.fake.mail, timeout=5):
                raise TimeoutError(f"nothing sent for {self.key}")
            self.t.copy_(self.fake.mail.pop(self.key))
        return True


class _Sent:
    def wait(self, timeout=None) -> bool:
        return True


class LazyNcclFake:
    """new_group / isend / irecv for ranks that are threads; a rank's first p2p call on a group blocks
    until the other member's first call on that group (or fails after `rendezvous_s`)."""

    def __init__(self, rendezvous_s: float = 3.0):
        self.local = threading.local()
        self.lock, self.cond = threading.Lock(), threading.Condition()
        self.groups: list[_Group] = []
        self.barriers: dict[int, threading.Barrier] = {}
        self.joined: set[tuple[int, int]] = set()
        self.mail: dict[tuple, torch.Tensor] = {}
        self.first_calls: dict[int, list[int]] = {}  # rank -> gids in the order of first use
        self.rendezvous_s = rendezvous_s

    @property
    def rank(self) -> int:
        return self.local.rank

    def new_group(self, ranks, backend=None, **kwargs):
        n = getattr(self.local, "groups_made", 0)
        self.local.groups_made = n + 1
        with self.lock:
            if n == len(self.groups):
                self.groups.append(_Group(n, list(ranks)))
            return self.groups[n]

    def _first_use(self, group: _Group) -> None:
        key = (group.gid, self.rank)
        if key in self.joined:
            return
        self.joined.add(key)
        self.first_calls.setdefault(self.rank, []).append(group.gid)
        with self.lock:
            barrier = self.barriers.setdefault(group.gid, threading.Barrier(2, timeout=self.rendezvous_s))
        barrier.wait()  # BrokenBarrierError: the other rank never reached this group (a hang on NCCL)

    def isend(self, t, dst=None, group=None, tag=0, **kwargs):
        self._first_use(group)
        with self.cond:
            self.mail[(group.gid, self.rank, dst, tag)] = t.clone()
            self.cond.notify_all()
        return _Sent()

    def irecv(self, t, src=None, group=None, tag=0, **kwargs):
        self._first_use(group)
        return _Recv(self, (group.gid, src, self.rank, tag), t)


def test_full_duplex_nccl_exchange_reaches_each_lane_in_the_same_order(monkeypatch):
    fake = LazyNcclFake()
    for name in ("new_group", "isend", "irecv"):
        monkeypatch.setattr(dist, name, getattr(fake, name))

    def rank_main(rank: int) -> list:
        fake.local.rank = rank
        ex = PairExchange(World(rank=rank, world_size=2, backend="nccl", device=torch.device("cpu")))
        ex.full_duplex()
        return [ex.exchange([torch.full((3,), float(rank + 1) * (r + 1))], (0, 1), r) for r in range(2)]

    # fails if the first exchange deadlocks on NCCL's lazy communicators
    results = run_in_threads(rank_main, 2, timeout=30)
    assert fake.first_calls[0] == fake.first_calls[1]  # both ranks reached the two lanes in one order
    for rank in range(2):
        other = 1 - rank
        for r, got in enumerate(results[rank]):
            assert torch.equal(got[0][0], torch.full((3,), float(other + 1) * (r + 1)))


@pytest.mark.parametrize("group", [(0, 1), (1, 0)])
def test_a_shared_group_still_posts_receives_first(monkeypatch, group):
    """Without lanes both directions share one group: the order in which works come back is recv, send."""
    posted = []
    monkeypatch.setattr(dist, "irecv", lambda t, src=None, group=None, tag=0: posted.append("recv") or _Sent())
    monkeypatch.setattr(dist, "isend", lambda t, dst=None, group=None, tag=0: posted.append("send") or _Sent())
    ex = PairExchange(World(rank=group[0], world_size=2, backend="gloo", device=torch.device("cpu")))
    ex._p2p([(torch.zeros(1), 5)], [(torch.zeros(1), 5)], group[1])
    assert posted == ["recv", "send"]
