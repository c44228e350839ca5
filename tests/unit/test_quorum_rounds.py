"""Quorum rounds for DiLoCo and SparseLoCo (issue 45): the rules of outer/quorum.py, the board and its clocks,
and whole in-process runs. Every straggler and outage here is scripted on a SimClock (virtual time, one replica
running at a time), so the outcomes are functions of the schedule, not of the machine's load or of sleeps.

At 78c329b none of this exists: the configs below fail with "unknown field(s) ['rounds']" and the modules
do not import."""

import math
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from decentrain.algorithms.diloco import DiLoCoConfig
from decentrain.algorithms.outer.quorum import (
    LATE_RULES,
    Delivery,
    GraceConfig,
    Member,
    RoundRecord,
    RoundsConfig,
    close,
    decode_delivery,
    decode_record,
    due,
    token_scales,
)
from decentrain.algorithms.outer.quorum_board import Board, Outage, RealClock, SimClock, SimulationError, use_board
from decentrain.algorithms.sparseloco import SparseLoCoConfig
from decentrain.core.comm.deadline import adaptive_deadline

INF = math.inf


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# -- the pure rules -----------------------------------------------------------------------------
def test_equal_tokens_give_scales_of_exactly_one_and_unequal_ones_the_weighted_mean():
    assert token_scales([4.0, 4.0, 4.0]) == [1.0, 1.0, 1.0]  # exactly, so the merge is the plain mean bit for bit
    assert token_scales([3.0] * 7) == [1.0] * 7  # 7·3/21 would also be 1, but not every m·w/Σw rounds to it
    deltas = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0]), torch.tensor([0.5, 0.0])]
    weights = [1.0, 2.0, 5.0]
    scales = token_scales(weights)
    merged = sum(s * d for s, d in zip(scales, deltas)) / len(deltas)
    weighted = sum(w * d for w, d in zip(weights, deltas)) / sum(weights)
    assert torch.allclose(merged, weighted)


def test_equal_tokens_merge_is_the_collective_mean_bit_for_bit():
    """DenseMean off the board sums in the record's order and divides by m: the in-process all-reduce's mean."""
    from decentrain.algorithms.diloco.diloco import DenseMean
    from decentrain.core.comm.inprocess_transport import InProcessHub

    torch.manual_seed(0)
    deltas = [[torch.randn(3, 5), torch.randn(7)] for _ in range(4)]
    hub = InProcessHub(4)
    pending = [hub.transport(r).start_mean(deltas[r]) for r in range(4)]
    collective = pending[3].result()  # every replica posted: the last one's wait completes at once

    class Algo:  # what DenseMean reads of its algorithm
        outer = type("O", (), {"slow": [torch.zeros(3, 5), torch.zeros(7)]})()

    codec = DenseMean(Algo())
    board, _ = codec.merge([(codec.to_bytes(d), 1.0, 0) for d in deltas])
    assert all(torch.equal(a, b) for a, b in zip(collective, board))
    short, metrics = codec.merge([(b"\x00" * 12, 1.0, 0), (codec.to_bytes(deltas[0]), 1.0, 0)])  # wrong size: dropped
    assert metrics["quorum/payload_dropped"] == 1 and all(torch.equal(a, b) for a, b in zip(short, deltas[0]))


def test_a_round_closes_when_every_live_replica_delivered_or_at_the_deadline_after_the_quorum():
    live = {0, 1, 2, 3}
    assert due({0, 1, 2, 3}, live, 3, now=1.0, deadline_at=INF) == (True, None)  # everyone in: close at once
    assert due({0, 1}, live, 3, now=1.0, deadline_at=5.0) == (False, None)  # no quorum: wait for a delivery
    assert due({0, 1, 2}, live, 3, now=1.0, deadline_at=5.0) == (False, 5.0)  # quorum: the grace window runs to D
    assert due({0, 1, 2}, live, 3, now=5.0, deadline_at=5.0) == (True, None)
    assert due({0, 1, 2}, live, 3, now=9.0, deadline_at=INF) == (False, INF)  # lock-step on the board: never by time
    assert due({0, 1}, {0, 1}, 3, now=1.0, deadline_at=5.0) == (True, None)  # fewer live than min_quorum: all live


def test_the_grace_deadline_is_the_existing_median_plus_k_mad_policy():
    g = GraceConfig(k=2.0, window=8, warmup=3, margin_s=0.1, cap_s=60.0)
    arrivals = [1.0, 1.2, 1.1, 3.0, 1.05]
    assert g.deadline(arrivals) == adaptive_deadline(arrivals, 2.0, 0.1, 60.0)
    assert g.deadline([1.0, 1.0]) == 60.0  # fewer than warmup arrivals: the cap
    assert GraceConfig(enabled=False, cap_s=7.0).deadline(arrivals) == 7.0
    assert GraceConfig(cap_s=None).deadline([]) == INF


def test_the_record_weights_fresh_by_tokens_and_stale_by_the_late_rule():
    ds = [
        Delivery(2, 5, 10, 1.0, 0.0),
        Delivery(0, 5, 10, 1.2, 0.0),
        Delivery(3, 4, 10, 9.0, 0.0),
        Delivery(0, 5, 10, 1.0, 0.0),
    ]  # a repeated delivery counts once
    fed = close(5, ds, {0, 1, 2, 3}, 4, 2.0, [], 32, LATE_RULES.get("fedasync"), 0.5, now=3.0)
    assert fed.members == [Member(0, 5, 10.0), Member(2, 5, 10.0), Member(3, 4, 10.0 * 2**-0.5)]
    assert fed.missed == [1, 3] and fed.arrivals == [1.2, 1.0, 2.0, 2.0] and not fed.full  # misses censored at D
    drop = close(5, ds, {0, 1, 2, 3}, 4, 2.0, [], 32, LATE_RULES.get("drop"), 0.5, now=3.0)
    assert [m.rank for m in drop.members] == [0, 2]
    everyone = close(
        0, [Delivery(r, 0, 4, 1.0, 0.0) for r in (1, 0)], {0, 1}, 2, INF, [], 32, LATE_RULES.get("drop"), 0.5, 1.0
    )
    assert everyone.full and everyone.deadline_s is None and [m.rank for m in everyone.members] == [0, 1]


def test_board_entries_decode_totally():
    rec = RoundRecord(3, [Member(1, 3, 4.0), Member(0, 2, 2.0)], False, 1.5, [1.0, 1.5], 7.0, [2])
    assert decode_record(rec.encode(), 4, 3, 32) == rec
    d = Delivery(1, 3, 4, 0.5, 9.0)
    assert decode_delivery(d.encode(), 4, 3) == d
    bad = [
        b"",
        b"\xff",
        b"[]",
        b"{}",
        b"null",
        b"x" * (2 << 20),
        Delivery(9, 3, 4, 0.5, 0).encode(),
        Delivery(1, 4, 4, 0.5, 0).encode(),
        Delivery(1, 3, 0, 0.5, 0).encode(),
        b'{"rank": 1, "base": 3, "steps": 4, "seconds": NaN, "time": 0}',
        b'{"rank": true, "base": 3, "steps": 4, "seconds": 1, "time": 0}',
    ]
    assert all(decode_delivery(b, 4, 3) is None for b in bad)
    assert all(decode_record(b, 4, 3, 32) is None for b in bad)
    assert decode_record(rec.encode(), 4, 2, 32) is None  # another round's record
    assert decode_record(rec.encode().replace(b"[1, 3, 4.0]", b"[7, 3, 4.0]"), 4, 3, 32) is None


def test_the_first_record_of_a_round_stands():
    board = Board(dist.HashStore(), 2, RealClock())
    a = RoundRecord(0, [Member(0, 0, 1.0)], False, 1.0, [], 1.0, [1])
    b = RoundRecord(0, [Member(0, 0, 1.0), Member(1, 0, 1.0)], True, 1.0, [], 1.0, [])
    assert board.publish(a, 4) == a
    assert board.publish(b, 4) == a  # a second closer reads the first record back


def test_bad_config_values_fail_in_one_line_naming_the_field():
    cases = [
        ({"min_quorum": 0}, r"algorithm.rounds.min_quorum=0 must be"),
        ({"late": "later"}, r"algorithm.rounds.late='later' is unknown"),
        ({"mode": "bogus"}, r"algorithm.rounds.mode='bogus' is unknown"),
        ({"staleness_exponent": float("nan")}, r"algorithm.rounds.staleness_exponent=nan"),
        ({"retain_rounds": 0}, r"algorithm.rounds.retain_rounds=0"),
    ]
    for fields, match in cases:
        with pytest.raises(ValueError, match=match):
            DiLoCoConfig(rounds=RoundsConfig(**fields))
    with pytest.raises(ValueError, match=r"^algorithm.rounds.grace.k=-1 must be"):
        GraceConfig(k=-1)
    with pytest.raises(ValueError, match=r"^algorithm.rounds.grace.cap_s=0 must be"):
        GraceConfig(cap_s=0)
    with pytest.raises(ValueError, match="algorithm.rounds.mode=quorum with algorithm.overlap=true"):
        DiLoCoConfig(overlap=True, rounds=RoundsConfig(mode="quorum"))
    with pytest.raises(ValueError, match="algorithm.rounds.mode=quorum with algorithm.adaptive_inner_steps=true"):
        DiLoCoConfig(adaptive_inner_steps=True, rounds=RoundsConfig(mode="quorum"))
    with pytest.raises(ValueError, match="algorithm.rounds.min_quorum=5 exceeds the 4 replicas"):
        DiLoCoConfig(rounds=RoundsConfig(mode="quorum", min_quorum=5)).rounds.check_world(4)


def test_torchft_groups_refuse_quorum_rounds():
    from decentrain.algorithms.diloco.torchft_diloco import TorchFTDiLoCo

    with pytest.raises(ValueError, match="algorithm.rounds.mode=quorum runs on the transport's board"):
        TorchFTDiLoCo.check_world(DiLoCoConfig(rounds=RoundsConfig(mode="quorum")), 1)  # before any worker starts


def test_sparseloco_gives_a_dropped_message_back_to_its_error_buffer():
    from decentrain.algorithms.outer.compression import CompressionSpec, ErrorFeedback, decompress
    from decentrain.algorithms.sparseloco.sparseloco import Message, SparsePayloads

    spec = CompressionSpec.flat(32, 16, 4, 2, "maxabs")
    ef = ErrorFeedback(spec, 0.9)
    delta = torch.randn(32)
    chunks = ef.step(delta)
    before = ef.error.clone()
    algo = type("A", (), {"ef": ef, "spec": spec})()
    SparsePayloads(algo).left_out(Message(chunks, b""))
    assert torch.equal(ef.error, before + decompress(chunks, spec))  # e ← e + D(c): nothing sent is lost


# -- the simulation clock -------------------------------------------------------------------------
def test_simclock_runs_the_replica_with_the_earliest_event_and_reports_outages():
    import threading

    clock = SimClock(2, lambda r, t, i: 1.0 if r == 0 else 3.0, {1: [Outage(4.0, 10.0, 5.0)]}, stuck_s=30)
    order, outages = [], {}

    def replica(r):
        clock.enter(r)
        for _ in range(3):
            o = clock.spend(r, 1)
            order.append((clock.now(r), r))
            if o is not None:
                outages[r] = o
                clock.sleep_until(r, o.end)
        clock.exit(r)

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == [(1.0, 0), (2.0, 0), (3.0, 0), (3.0, 1), (4.0, 1), (13.0, 1)]  # events in time order
    assert outages == {1: Outage(4.0, 10.0, 5.0)}  # its second step would end at 6 > 4: down from 4


def test_simclock_names_a_deadlock_instead_of_hanging():
    import threading

    clock = SimClock(1, lambda r, t, i: 1.0, stuck_s=30)
    errors = []

    def replica():
        clock.enter(0)
        try:
            clock.wait(0, None)  # nobody can ever notify
        except SimulationError as e:
            errors.append(str(e))

    t = threading.Thread(target=replica)
    t.start()
    t.join()
    assert errors and "wait for a change that cannot come" in errors[0]


# -- whole runs ---------------------------------------------------------------------------------------
def _cfg(algorithm: dict, steps: int):
    from decentrain.config import config_from_dict

    return config_from_dict(
        {
            "algorithm": algorithm,
            "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
            "train": {
                "steps": steps,
                "global_batch_size": 8,
                "micro_batch_size": 1,
                "eval_every": 1000,
                "eval_batches": 1,
                "checkpoint_every": 1000,
                "threads": 1,
                "seed": 0,
            },
            "logger": {"progress": False, "console": False, "log_every": 1000},
        }
    )


def _run(algorithm: dict, n: int, steps: int, clock: SimClock | RealClock | None = None):
    """In-process replicas; with `clock`, their quorum rounds meet on a board of ours, on that clock."""
    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process

    board = None if clock is None else Board(dist.HashStore(), n, clock)

    def wrap(transport):
        use_board(transport.hub, board)
        return transport

    with tempfile.TemporaryDirectory() as d:
        runs = run_replicas_in_process(
            _cfg(algorithm, steps), n, Path(d), wrap_transport=None if clock is None else wrap
        )
    return runs, board


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _records(board: Board) -> list[RoundRecord]:
    out, r = [], 0
    while (rec := board.record(r)) is not None:
        out.append(rec)
        r += 1
    return out


@pytest.mark.parametrize("name", ["diloco", "sparseloco"])
@pytest.mark.parametrize("n", [2, 4])
def test_quorum_rounds_with_every_replica_on_time_are_lockstep_bit_for_bit(name, n, one_thread):
    """On time: the board's round is the collective itself (real clock), and the board's own merge (virtual
    clock, no collective) sums the same payloads in the same order."""
    lockstep, _ = _run({"name": name, "inner_steps": 2}, n, 6)
    quorum, real = _run({"name": name, "inner_steps": 2, "rounds": {"mode": "quorum"}}, n, 6, RealClock())
    sim, board = _run(
        {"name": name, "inner_steps": 2, "rounds": {"mode": "quorum", "min_quorum": 1}},
        n,
        6,
        SimClock(n, lambda r, t, i: 1.0, stuck_s=120),
    )
    assert all(rec.full and len(rec.members) == n for rec in _records(board) + _records(real))  # nobody was late
    # the on-time rounds ran as the collective: no payload went through the store, the bytes sent are lock-step's
    assert not any(real.store.check([f"r{r}/p{rank}.{r}"]) for r in range(3) for rank in range(n))
    for a, b, c in zip(lockstep, quorum, sim):
        assert a.result.final_step == b.result.final_step == c.result.final_step == 6
        assert _same(a.weights, b.weights) and _same(a.weights, c.weights)
        assert a.exchange_stats["bytes_sent"] == b.exchange_stats["bytes_sent"]


STRAGGLER = 3  # rank 3 runs 3x slower; rank 1 is down from t=9.5 (noticed at 10.5) until t=14


def _faulty_clock(n: int = 4, outage: bool = True) -> SimClock:
    return SimClock(
        n, lambda r, t, i: 3.0 if r == STRAGGLER else 1.0, {1: [Outage(9.5, 14.0, 10.5)]} if outage else {}, stuck_s=120
    )


@pytest.mark.parametrize(
    "name,late", [("diloco", "drop"), ("diloco", "fedasync"), ("sparseloco", "drop"), ("sparseloco", "fedasync")]
)
def test_every_replica_ends_on_identical_slow_weights_with_a_straggler_and_an_outage(name, late, one_thread):
    rounds = {"mode": "quorum", "min_quorum": 3, "late": late, "grace": {"warmup": 1, "margin_s": 0.5}}
    runs, board = _run({"name": name, "inner_steps": 2, "rounds": rounds}, 4, 16, _faulty_clock())
    recs = _records(board)
    assert len(recs) == 8  # the run's rounds all closed
    missed = [rec.round for rec in recs if STRAGGLER in rec.missed]
    assert len(missed) >= 4  # the straggler was late for most rounds: the late paths ran
    assert any(1 in rec.missed for rec in recs) or any(1 not in [m.rank for m in rec.fresh] for rec in recs)
    stale = [m for rec in recs for m in rec.members if m.base < rec.round]
    assert bool(stale) == (late == "fedasync")  # late pseudo-gradients merged only under fedasync, discounted
    assert all(m.weight < 2.0 for m in stale)
    for run in runs[1:]:
        assert _same(runs[0].weights, run.weights)  # the identical slow weights, θ = φ after the last round


def test_quorum_rounds_do_not_wait_for_the_straggler_and_lockstep_on_the_board_does(one_thread):
    quorum = {"mode": "quorum", "min_quorum": 3, "grace": {"warmup": 1, "margin_s": 0.5}}
    lockstep = {"mode": "quorum", "min_quorum": 4, "grace": {"cap_s": None}}  # wait for every live replica
    _, qb = _run({"name": "diloco", "inner_steps": 2, "rounds": quorum}, 4, 16, _faulty_clock(outage=False))
    _, lb = _run({"name": "diloco", "inner_steps": 2, "rounds": lockstep}, 4, 16, _faulty_clock(outage=False))
    q, lock = _records(qb), _records(lb)
    assert [rec.closed_at for rec in lock] == [6.0 * (r + 1) for r in range(8)]  # every round waited for the 3x replica
    # round 0 waits too (the deadline is its cap until `warmup` arrivals); then a round closes the grace margin
    # after the quorum (2 s of steps + 0.5 s), or at once (2 s) while the late straggler sits a round out
    gaps = [b.closed_at - a.closed_at for a, b in zip(q, q[1:])]
    assert q[0].closed_at == 6.0 and set(gaps) == {2.0, 2.5} and q[-1].closed_at < 0.5 * lock[-1].closed_at


def test_a_schedule_gives_the_same_run_twice(one_thread):
    rounds = {"mode": "quorum", "min_quorum": 3, "late": "fedasync", "grace": {"warmup": 1, "margin_s": 0.5}}
    a, ab = _run({"name": "diloco", "inner_steps": 2, "rounds": rounds}, 4, 8, _faulty_clock())
    b, bb = _run({"name": "diloco", "inner_steps": 2, "rounds": rounds}, 4, 8, _faulty_clock())
    assert _records(ab) == _records(bb)
    assert all(_same(x.weights, y.weights) for x, y in zip(a, b))


def test_min_quorum_defaults_to_all_but_one():
    assert SparseLoCoConfig(rounds=RoundsConfig(mode="quorum", min_quorum=2)).rounds.quorum(4) == 2
    assert RoundsConfig().quorum(8) == 7 and RoundsConfig().quorum(1) == 1
