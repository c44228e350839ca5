"""The in-process transport (replicas as threads), and NoLoCo's partner mean over it."""

import pytest
import torch

from decentrain.core.comm.bytes_comm import PayloadTooLarge
from decentrain.core.comm.inprocess_transport import InProcessHub
from decentrain.testing import run_in_threads


def test_exchange_collectives_and_bytes():
    hub = InProcessHub(3)

    def replica(rank):
        tp = hub.transport(rank)
        pair = tp.exchange([torch.tensor([float(rank)])], (0, 1) if rank < 2 else (2,), 0)
        mean = tp.start_mean([torch.tensor([1.0, 2.0]) * (rank + 1)]).result()
        try:
            gathered = tp.all_gather_bytes(b"x" * (rank + 1) * 10, max_bytes=25)
        except PayloadTooLarge:  # rank 2's own 30 bytes: it contributes b"" and is told so
            gathered = None
        low = tp.all_reduce_min(5.0 - rank)
        return pair, mean, gathered and list(gathered), gathered and gathered.dropped, low

    (p0, m0, g0, d0, low0), (p1, *_), (p2, _, g2, *_) = run_in_threads(replica, 3)
    assert float(p0[0][0]) == 1.0 and float(p1[0][0]) == 0.0 and p2 == []
    assert torch.equal(m0[0], torch.tensor([2.0, 4.0]))
    assert g0 == [b"x" * 10, b"x" * 20, b""] and d0 == [] and g2 is None and low0 == 3.0


def test_a_partner_that_skips_or_misses_the_deadline_costs_the_round():
    hub = InProcessHub(2, deadline_s=0.2)
    a, b = hub.transport(0), hub.transport(1)
    b.skip_round((0, 1), 0)
    assert a.exchange([torch.zeros(2)], (0, 1), 0) is None and a.stats.skipped == 1
    assert a.exchange([torch.zeros(2)], (0, 1), 1) is None and a.stats.timeouts == 1  # b never sends round 1


def test_an_oversized_own_payload_contributes_nothing_then_raises():
    hub = InProcessHub(1)
    with pytest.raises(PayloadTooLarge):
        hub.transport(0).all_gather_bytes(b"abc", max_bytes=2)


def test_noloco_forms_the_partner_mean_in_fp32_for_bf16_weights():
    """bf16 weights 1 and 1 + 2**-7 average to 1 + 2**-8, which bf16 cannot hold: rounding θ̄ to bf16
    first (as the exchange once did) gave φ = 1 exactly, losing the whole pull."""
    from decentrain.algorithms.noloco.noloco import NoLoCo, NoLoCoConfig
    from decentrain.algorithms.outer.optimizers import OuterOptimizerConfig
    from decentrain.core.world import World

    hub = InProcessHub(2)
    cfg = NoLoCoConfig(inner_steps=1, outer_optimizer=OuterOptimizerConfig("noloco", 0.5, 0.0), stall_s=None)

    def replica(rank):
        model = torch.nn.Linear(1, 1, bias=False).to(torch.bfloat16)
        with torch.no_grad():
            model.weight.fill_(1.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        algo = NoLoCo(cfg, World(rank=rank, world_size=2))
        algo.transport = hub.transport(rank)
        algo.on_train_start(model, opt)
        with torch.no_grad():
            model.weight.fill_(1.0 + rank * 2**-7)  # the inner steps moved replica 1 one bf16 ulp
        algo.after_optimizer_step(1, model, opt)
        return float(algo.phi[0])

    phis = run_in_threads(replica, 2)
    assert phis == [1.0 + 0.5 * 2**-8] * 2  # φ + η·(θ̄ − φ), θ̄ = 1 + 2**-8 exactly in fp32
