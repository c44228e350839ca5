"""SparseLoCo's all-gather on 3 gloo ranks: a rank sending junk is dropped and counted, never averaged."""

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]  # above run_ranks' 300 s


def _two_rounds(world, junk_rank):
    import decentrain.algorithms.sparseloco.sparseloco as sl
    from decentrain.algorithms.sparseloco import SparseLoCo, SparseLoCoConfig

    if world.rank == junk_rank:  # right size, wrong bytes: passes the size cap, fails the header check
        real = sl.encode
        sl.encode = lambda c, spec, r: bytes(len(real(c, spec, r)))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    algo = SparseLoCo(SparseLoCoConfig(inner_steps=1, chunk_size=16, topk=4, bits=4), world)
    algo.on_train_start(model, None)
    dropped = []
    for step in (1, 2):
        with torch.no_grad():
            model.weight.add_(0.1 * (world.rank + 1) * step)
        dropped.append(algo.after_optimizer_step(step, model, None)["outer/payload_dropped"])
    return dropped, [p.detach().tolist() for p in model.parameters()]  # plain lists: tensors would outlive the rank


def test_junk_payload_is_dropped_and_honest_replicas_stay_identical():
    results = run_ranks(_two_rounds, 3, 2, timeout=300)
    for dropped, _ in results:
        assert dropped == [1.0, 1.0]
    # every rank averaged the same two honest payloads, in rank order
    assert results[0][1] == results[1][1]
