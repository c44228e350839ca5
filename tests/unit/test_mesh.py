"""The replicas × shards rank layout and the engine config's refusals."""

import pytest

from decentrain.algorithms.pretraining.engines import ENGINES
from decentrain.core.mesh import layout_ranks, replica_layout
from decentrain.core.world import World


def test_replicas_are_neighbouring_ranks_and_shards_stride_across_them():
    per_replica, per_shard = layout_ranks(8, 2)
    assert per_replica == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert per_shard == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # every rank is in exactly one replica and one cross-replica group
    assert sorted(sum(per_replica, [])) == sorted(sum(per_shard, [])) == list(range(8))
    assert layout_ranks(4, 1) == ([[0], [1], [2], [3]], [[0, 1, 2, 3]])
    assert layout_ranks(4, 4) == ([[0, 1, 2, 3]], [[0], [1], [2], [3]])


def test_layout_refuses_shards_that_do_not_divide_the_world():
    with pytest.raises(ValueError, match="engine.shards_per_replica=3"):
        layout_ranks(4, 3)


def test_one_shard_per_replica_keeps_the_world_as_the_outer_world():
    world = World(rank=1, world_size=2)
    layout = replica_layout(world, 1)
    assert layout.outer is world and (layout.replica, layout.shard, layout.replicas) == (1, 0, 2)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"name": "deepspeed", "zero_stage": 3}, "engine.zero_stage=3"),
        ({"name": "deepspeed", "zero_stage": 0}, "engine.zero_stage=0"),
        ({"name": "torch", "shards_per_replica": 2}, "engine.shards_per_replica=2"),
        ({"name": "megatron"}, "engine.name='megatron'"),
        (
            {"name": "torch", "zero_stage": 2},
            "engine: unknown field.s. .'zero_stage'.; allowed: .'name', 'shards_per_replica'.",
        ),  # deepspeed's
    ],
)
def test_engine_config_refusals_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        ENGINES.config(kwargs)
