"""NoLoCo and DiLoCo over torch.distributed (gloo, one process per replica) and over the in-process
transport (one thread per replica) give bit-identical weights on every replica, several rounds in:
the transport is only the wire, the training is the library's own in both."""

from pathlib import Path

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 8
ALGO = {
    # 4 rounds; no stall rule: on a loaded CI machine a starved heartbeat thread would skip a pairing
    "noloco": {"name": "noloco", "inner_steps": 2, "pairing_seed": None, "stall_s": None},
    "diloco": {"name": "diloco", "inner_steps": 2},
}


def _cfg(algo: str):
    from decentrain.config import config_from_dict

    return config_from_dict(
        {
            "algorithm": ALGO[algo],
            "model": {"hidden_size": 16, "num_layers": 2, "num_heads": 2, "intermediate_size": 32},
            "data": {"seq_len": 16, "max_bytes_per_domain": 8000, "domains": ["licenses"]},
            "train": {
                "steps": STEPS,
                "global_batch_size": 8,
                "micro_batch_size": 1,
                "eval_every": 100,
                "eval_batches": 1,
                "checkpoint_every": 100,
                "threads": 1,
            },
            "logger": {"progress": False, "log_every": 1},
            "launcher": {"name": "torchrun", "nproc_per_node": None},
        }
    )


def _multi_process(world, algo, root):
    from decentrain.algorithms.pretraining.run import run_pretraining
    from decentrain.core.checkpoint import Checkpointer

    run_dir = Path(root) / "dist"
    run_pretraining(_cfg(algo), world, run_dir)
    from safetensors.torch import save

    # as bytes: tensors would travel back through shared memory the exiting rank closes
    return save(Checkpointer(run_dir / "checkpoints", world.rank, world.world_size).load(STEPS)["model"])


@pytest.mark.parametrize("algo", list(ALGO))
def test_both_transports_give_the_same_weights(tmp_path, algo):
    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process

    world_size = 4 if algo == "noloco" else 2  # sums of 2 are order-free: gloo's ring and rank order agree
    from safetensors.torch import load

    over_gloo = [load(blob) for blob in run_ranks(_multi_process, world_size, algo, str(tmp_path), timeout=600)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each gloo rank runs (train.threads=1): the same kernels, the same bits
    try:
        in_process = run_replicas_in_process(_cfg(algo), world_size, tmp_path / "inprocess")
    finally:
        torch.set_num_threads(threads)
    for rank in range(world_size):
        mine, theirs = in_process[rank].weights, over_gloo[rank]
        assert set(mine) == set(theirs)
        different = [k for k in mine if not torch.equal(mine[k], theirs[k])]
        assert not different, f"rank {rank}: {different[:3]} differ between the transports"
        assert in_process[rank].result.final_step == STEPS
    # several rounds really moved the replicas apart (NoLoCo) or together (DiLoCo) from the start
    if algo == "noloco":
        assert any(not torch.equal(in_process[0].weights[k], in_process[1].weights[k]) for k in in_process[0].weights)
        assert in_process[0].exchange_stats["rounds"] == STEPS // 2
    else:
        assert all(torch.equal(in_process[0].weights[k], in_process[1].weights[k]) for k in in_process[0].weights)
