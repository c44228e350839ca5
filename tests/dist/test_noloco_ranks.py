"""NoLoCo on real gloo ranks: no collective after start-up, the outer step, shape mismatch, pacing."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from decentrain.algorithms.diloco import DiLoCo, DiLoCoConfig
from decentrain.algorithms.noloco import NoLoCo, NoLoCoConfig
from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
from decentrain.core.comm.pairing import gossip_groups, group_of
from decentrain.testing import run_ranks

pytestmark = pytest.mark.dist

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "barrier",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "all_gather_object",
    "broadcast_object_list",
    "new_group",
)
P2P = ("isend", "irecv", "send", "recv", "batch_isend_irecv")


def _count_calls(world, run_dir):
    from decentrain.algorithms.pretraining.run import run_pretraining
    from decentrain.config import config_from_dict

    calls: list[tuple[str, str]] = []
    phase = ["start-up"]
    for name in COLLECTIVES + P2P:
        original = getattr(dist, name)

        def counted(*a, _name=name, _orig=original, **k):
            calls.append((phase[0], _name))
            return _orig(*a, **k)

        setattr(dist, name, counted)
    from decentrain.core.comm import pair_groups  # exchanges on per-pair groups call the group's send/recv directly

    class CountedPair:
        def __init__(self, pg):
            self.pg = pg

        def send(self, *a):
            calls.append((phase[0], "isend"))
            return self.pg.send(*a)

        def recv(self, *a):
            calls.append((phase[0], "irecv"))
            return self.pg.recv(*a)

    get = pair_groups.PairGroups.get
    pair_groups.PairGroups.get = lambda self, *a: (CountedPair(get(self, *a)[0]), get(self, *a)[1])
    start = NoLoCo.on_train_start

    def mark(self, *a):
        start(self, *a)
        phase[0] = "training"

    NoLoCo.on_train_start = mark
    cfg = config_from_dict(
        {
            "algorithm": {"name": "noloco", "inner_steps": 2},
            "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
            "train": {
                "steps": 6,
                "global_batch_size": 4,
                "micro_batch_size": 1,
                "eval_every": 3,
                "eval_batches": 1,
                "checkpoint_every": 3,
                "threads": 1,
            },
            "logger": {"progress": False},
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )
    run_pretraining(cfg, world, Path(run_dir))
    return calls


def test_noloco_issues_no_collective_after_start_up(tmp_path):
    for calls in run_ranks(_count_calls, 4, str(tmp_path)):
        during = [name for phase, name in calls if phase == "training"]
        assert [n for n in during if n in COLLECTIVES] == []  # no all-reduce, no barrier, nothing global
        assert during.count("isend") == during.count("irecv") == 6  # header + body per round, 3 rounds
        assert {"all_gather", "broadcast"} <= {n for p, n in calls if p == "start-up"}


def _outer_step(world):
    model = torch.nn.Linear(2, 1, bias=False)
    model.weight.data.fill_(float(world.rank))  # broadcast at start-up makes this rank 0's: 0
    algo = NoLoCo(
        NoLoCoConfig(inner_steps=1, outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.5), pairing_seed=4), world
    )
    algo.on_train_start(model, None)
    start = model.weight.detach().clone()
    model.weight.data.fill_(float(world.rank + 1))  # θ_i = i + 1 after the inner step
    algo.after_optimizer_step(1, model, None)
    return start.tolist(), model.weight.detach().tolist()


def test_noloco_outer_step_on_4_ranks_matches_the_hand_computed_update():
    results = run_ranks(_outer_step, 4)
    groups = gossip_groups(0, 4, seed=4)
    for rank, (start, after) in enumerate(results):
        assert start == [[0.0, 0.0]]
        theta_bar = sum(r + 1 for r in group_of(rank, groups)) / 2
        m = 0.5 * (theta_bar - 0.0)  # m = μ·0 + η·(θ̄ − φ); φ = θ = 0 + m
        assert after == [[pytest.approx(m)] * 2]


def _mismatch(world):
    model = torch.nn.Linear(4 if world.rank == 0 else 5, 1)
    try:
        NoLoCo(NoLoCoConfig(inner_steps=1), world).on_train_start(model, None)
    except ValueError as e:
        return str(e)
    return "no error"


def test_mismatched_model_shapes_fail_on_every_rank_without_hanging():
    # a rank left hanging would end in gloo's own 120 s timeout, whose message fails the assertion; run_ranks'
    # default limit leaves start-up on a loaded box its minutes
    for msg in run_ranks(_mismatch, 2):
        assert "model: replicas disagree on parameter shapes" in msg and "ranks [1]" in msg


class _StepClock:
    """The algorithm's step timer, injected: every inner step takes `seconds` exactly. A real clock on a
    loaded box adds noise to each step, and the running-fastest rule turns that into a smaller H."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def start(self) -> None:
        pass

    def stop(self) -> float:
        return self.seconds


def _paced(world, family, total):
    model = torch.nn.Linear(2, 1)
    cls, cfg = {"noloco": (NoLoCo, NoLoCoConfig), "diloco": (DiLoCo, DiLoCoConfig)}[family]
    algo = cls(cfg(inner_steps=8, adaptive_inner_steps=True), world)
    algo.on_train_start(model, None)
    algo.timer = _StepClock(0.01 if world.rank % 2 == 0 else 0.04)  # odd ranks are 4x slower
    step = 0
    while step < total and not algo.should_stop(step, total):
        step += 1
        algo.after_optimizer_step(step, model, None)
    return step, algo.round, algo.h


@pytest.mark.parametrize("family", ["noloco", "diloco"])
def test_adaptive_inner_steps_let_slow_workers_take_fewer_steps_per_round(family):
    results = run_ranks(_paced, 2, family, 40)
    (fast_steps, fast_rounds, fast_h), (slow_steps, slow_rounds, slow_h) = results
    assert fast_rounds == slow_rounds == 5  # same number of syncs: nobody waits for a missing partner
    assert fast_h == 8 and slow_h == 2  # 8 · 0.01 / 0.04
    assert fast_steps == 40 and slow_steps < fast_steps
