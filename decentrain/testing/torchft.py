"""A torchft-style harness for decentrain's torchft algorithms (tests/dist/test_torchft_*.py), and
`lighthouse`, a LighthouseServer for the length of a `with` block.

Modelled on torchft's own `manager_integ_test.Runner` / `EventInjector`: each replica group
runs in a thread of this process (ranks of a group in threads too), joined by a
LighthouseServer; an injected failure raises out of the group's loop, and the group starts
again from a fresh model (other initial weights, so only a heal can make it agree). The
loop is the Trainer's, in miniature: draw a batch, forward/backward through the
algorithm's wrapped model, optimizer.step (the algorithm's hooks), step += 1,
after_optimizer_step, and the algorithm sees the trainer's state through
attach_trainer_state, as decentrain's Trainer does.

Nothing here depends on which thread gets the CPU first: the groups that start together meet
at a barrier once each has its manager (heartbeating), so the first quorum waits for all of them
(the lighthouse waits for healthy stragglers), and a failure fires at a state of the group (its
first committed step at or past N), which a heal that jumps steps cannot skip.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from decentrain.algorithms.pretraining.torchft import FT_ALGORITHMS
from decentrain.algorithms.pretraining.transports.torchft_groups import TorchFTConfig
from decentrain.core.world import World

INIT_LOCK = threading.Lock()


@contextlib.contextmanager
def lighthouse(
    min_replicas: int = 2, join_timeout_ms: int = 60_000, heartbeat_timeout_ms: int = 5_000
) -> Iterator[str]:
    """A torchft LighthouseServer on a free port for the block; yields its address.

    The first quorum waits for every heartbeating group (up to `join_timeout_ms`); a group counts as
    gone `heartbeat_timeout_ms` after its last heartbeat. Both are long: on a loaded box a live group's
    heartbeat may be late, and a late one must not be taken for a dead one.
    """
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind="[::]:0",
        min_replicas=min_replicas,
        join_timeout_ms=join_timeout_ms,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )
    try:
        yield server.address()
    finally:
        server.shutdown()


class InjectedFailure(Exception):
    pass


class TwoLayer(nn.Module):
    """torchft's MyModel, with its two layers named so Streaming DiLoCo can fragment them."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 4)
        self.second = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


FRAGMENTS = [["first.weight", "first.bias"], ["second.weight", "second.bias"]]


@dataclass
class Events:
    """What to do at (rank, step): fail (raise) or fail the next allreduce, at the rank's first step >= `step`.

    "At or past", not "at": a group that joined late heals to the others' step and never runs the
    steps in between; it must still fail, at its first step past the mark.
    """

    fail_at: set[tuple[int, int]] = field(default_factory=set)
    fail_allreduce_at: set[tuple[int, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: dict[str, int] = field(default_factory=lambda: {"failure": 0, "allreduce_failure": 0})

    def take(self, kind: str, rank: int, step: int) -> bool:
        with self.lock:
            target = self.fail_at if kind == "failure" else self.fail_allreduce_at
            due = next(((r, s) for r, s in sorted(target) if r == rank and s <= step), None)
            if due is not None:
                target.discard(due)
                self.counts[kind] += 1
                return True
            return False


def fail_next_allreduce(manager) -> None:
    """The next cross-group allreduce reports an error, as torchft's FakeProcessGroupWrapper.report_future_error."""
    allreduce = manager.allreduce

    def failing(*args, **kwargs):
        manager.allreduce = allreduce
        work = allreduce(*args, **kwargs)
        manager.report_error(RuntimeError("injected allreduce error"))
        return work

    manager.allreduce = failing


class MiniTrainer:
    def __init__(self, algorithm, world: World, replica_id: int, init_seed: int):
        self.algorithm, self.world, self.replica_id = algorithm, world, replica_id
        with INIT_LOCK:  # threads share torch's global RNG
            torch.manual_seed(init_seed)
            self.model = TwoLayer()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.05)
        self.step, self.position = 0, 0

    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": {"position": self.position},
            "algorithm": self.algorithm.state_dict(),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.position = int(state["sampler"]["position"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.step = int(state["step"])

    def batch(self) -> torch.Tensor:
        # every group and rank reads its own data, a function of (where it is, who it is) only
        g = torch.Generator().manual_seed(
            10_000 * (self.replica_id * self.world.world_size + self.world.rank) + self.position
        )
        self.position += 1
        return torch.randn(4, 3, generator=g)

    def run(
        self,
        steps: int,
        events: Events,
        record: Callable[[int, "MiniTrainer"], None],
        ready: Callable[[], None] = lambda: None,
    ) -> dict[str, Any]:
        algo = self.algorithm
        algo.attach_trainer_state(self.state, self.load)
        model = algo.wrap_model(self.model)  # builds the manager: from here on the group heartbeats
        # every group heartbeats before any takes its first quorum: a group that took it alone (min_replicas=1)
        # would wait at the barrier while the late one's quorum waited on it (CI, under load)
        ready()
        algo.on_train_start(self.model, self.optimizer)
        try:
            while self.step < steps:
                x = self.batch()
                model(x).pow(2).mean().backward()
                if events.take("allreduce_failure", self.world.rank, self.step + 1):
                    fail_next_allreduce(algo.manager)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                if events.take("failure", self.world.rank, self.step):  # before the next quorum, as torchft's tests
                    raise InjectedFailure(f"replica {self.replica_id} rank {self.world.rank} step {self.step}")
                algo.after_optimizer_step(self.step, self.model, self.optimizer)
                record(self.step, self)
        except BaseException:  # a dead group: its manager stops serving and heartbeating (a process exit would)
            algo.manager.shutdown(wait=False)
            raise
        algo.on_train_end(self.model)
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "step": self.step,
            "position": self.position,
            "manager_step": algo.manager.current_step(),
            "algorithm": algo,
            "state": copy.deepcopy(self.state()),
        }  # what the Trainer checkpoints, for whole-job restarts


def diloco_global_state(algo) -> dict[str, torch.Tensor]:
    """Each fragment's global (last synced) weights: what every replica must agree on after a sync."""
    return {
        f"{i}/{k}": v.clone() for i, f in enumerate(algo.diloco._fragments) for k, v in f.original_parameters.items()
    }


@dataclass
class Replica:
    replica_id: int
    lighthouse: str
    cfg: Any
    steps: int
    events: Events = field(default_factory=Events)
    world_size: int = 1
    attempts: int = 3
    record: Callable[[int, int, int, MiniTrainer], None] = lambda replica, rank, step, trainer: None
    timeout_s: float = 20.0
    give_up: bool = False  # after the last attempt fails, end quietly (a group that never comes back)
    resume: list[dict[str, Any]] | None = None  # per rank: a checkpointed state to start from (a whole-job restart)
    start: threading.Barrier | None = None  # set by run_replicas: the groups that start together meet here once

    def _ready(self, attempt: int) -> None:
        if attempt == 0 and self.start is not None:
            self.start.wait(120)  # BrokenBarrierError if a group never got its manager

    def _group(self, attempt: int) -> list[dict[str, Any]]:
        store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
        ft = TorchFTConfig(
            replicas=3,
            replica_id=self.replica_id,
            lighthouse=self.lighthouse,
            timeout_s=self.timeout_s,
            quorum_timeout_s=self.timeout_s,
        )
        group = ft.replica_group(store_addr="localhost", store_port=store.port)

        def rank_main(rank: int) -> dict[str, Any]:
            intra = None
            if self.world_size > 1:
                # each rank its own store client: two threads blocking on one client's socket deadlock gloo's rendezvous
                client = dist.TCPStore("localhost", store.port, is_master=False)
                intra = dist.ProcessGroupGloo(dist.PrefixStore(f"intra/{attempt}", client), rank, self.world_size)
            world = World(rank=rank, world_size=self.world_size, backend="gloo" if intra else None, group=intra)
            algo = FT_ALGORITHMS.get(self.cfg.name)(self.cfg, world, group, self.steps)
            trainer = MiniTrainer(algo, world, self.replica_id, init_seed=attempt * 7 + 1)
            if self.resume is not None:  # as Trainer.maybe_resume: before the algorithm starts
                trainer.load(self.resume[rank])
            return trainer.run(
                self.steps,
                self.events,
                lambda step, t: self.record(self.replica_id, rank, step, t),
                ready=lambda: self._ready(attempt),
            )

        with ThreadPoolExecutor(max_workers=self.world_size) as pool:
            futures = [pool.submit(rank_main, r) for r in range(self.world_size)]
            return [f.result() for f in futures]

    def run(self) -> list[dict[str, Any]]:
        for attempt in range(self.attempts):
            try:
                return self._group(attempt)
            except InjectedFailure:
                if attempt == self.attempts - 1:
                    if self.give_up:
                        return []
                    raise
        raise RuntimeError("ran out of attempts")


def run_replicas(
    replicas: list[Replica], gates: list[threading.Event | None] | None = None
) -> list[list[dict[str, Any]]]:
    """Run the groups to the end; a group with a gate starts once the gate is set (a late joiner).

    The groups without a gate take their first quorum together: every rank of each waits, once its
    manager exists, for all the others (a thread that got the CPU first would else train alone).
    """

    def start(r: Replica, gate: threading.Event | None):
        if gate is not None:
            assert gate.wait(120), "the gate was never opened"
        return r.run()

    gates = gates or [None] * len(replicas)
    together = [r for r, g in zip(replicas, gates) if g is None]
    barrier = threading.Barrier(sum(r.world_size for r in together))
    for r in together:
        r.start = barrier
    with ThreadPoolExecutor(max_workers=len(replicas)) as pool:
        futures = [pool.submit(start, r, g) for r, g in zip(replicas, gates)]
        return [f.result() for f in futures]
