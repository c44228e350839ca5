"""gather_on_host, FSDP2's whole-weights path for ranks that share one GPU over gloo (where
DTensor's own gather segfaults on CUDA), returns what get_model_state_dict returns where both run."""

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = [pytest.mark.dist]


def _both_gathers(world):
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from decentrain.algorithms.pretraining.engines.fsdp2 import gather_on_host

    mesh = init_device_mesh("cpu", (world.world_size,))
    torch.manual_seed(0)
    # 65 rows: uneven shards; 3 rows over 4 ranks: the last rank holds none
    model = torch.nn.Sequential(torch.nn.Linear(33, 65), torch.nn.Linear(65, 7), torch.nn.Linear(7, 3))
    model.register_buffer("scale", torch.arange(5.0))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().add_(world.rank)  # shards that differ by rank: a misplaced piece changes the result
    ours = gather_on_host(model, dist.group.WORLD)
    reference = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if world.rank != 0:
        return None
    assert ours.keys() == reference.keys()
    return {k: (tuple(ours[k].shape), ours[k].device.type, torch.equal(ours[k], reference[k])) for k in ours}


def test_host_gather_matches_the_reference_full_state_dict_on_uneven_shards():
    out = run_ranks(_both_gathers, 4)[0]
    assert out["0.weight"][0] == (65, 33) and out["2.weight"][0] == (3, 7) and out["scale"][0] == (5,)
    assert all(device == "cpu" and same for _, device, same in out.values()), out
