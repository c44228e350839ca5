"""The 2-D layout of ranks: replicas × shards (like torchtitan's parallel dims).

Each replica is `shards` neighbouring ranks that train one model together with an inner
engine (e.g. DeepSpeed ZeRO-1/2, which shards optimizer state and gradients but leaves
every rank with full parameters). The outer algorithm (DiLoCo, NoLoCo) sees a world of
replicas: shard rank s of every replica syncs with the shard-s ranks of the others, and
since all shard ranks of a replica hold the same weights, they compute the same result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from decentrain.core.world import World


def layout_ranks(world_size: int, shards: int) -> tuple[list[list[int]], list[list[int]]]:
    """(ranks of each replica, ranks of each shard index across replicas) in global ranks.

    Replica r owns ranks r·S .. r·S+S−1, so a replica's shards are neighbours (one node
    under torchrun) and the cross-replica traffic is the one that crosses nodes.
    """
    if shards < 1 or world_size % shards:
        raise ValueError(f"engine.shards_per_replica={shards} must be >= 1 and divide the world size {world_size}")
    replicas = world_size // shards
    per_replica = [list(range(r * shards, (r + 1) * shards)) for r in range(replicas)]
    per_shard = [list(range(s, world_size, shards)) for s in range(shards)]
    return per_replica, per_shard


@dataclass
class ReplicaLayout:
    replica: int  # this rank's replica index
    shard: int  # this rank's index inside its replica
    replicas: int
    shards: int
    shard_group: dist.ProcessGroup | None  # the ranks of this replica (the inner engine's data parallel)
    outer: World  # this rank seen by the outer algorithm: rank = replica, group = same shard across replicas
    mesh: DeviceMesh | None = None  # the 2-D (replica, shard) mesh; None with one shard per replica


def replica_layout(world: World, shards: int) -> ReplicaLayout:
    """Split `world` into replicas of `shards` ranks; collective when shards > 1 (call on every rank)."""
    layout_ranks(world.world_size, shards)  # validates
    if shards == 1:  # one rank per replica: the outer world is the whole world, no new groups
        return ReplicaLayout(world.rank, 0, world.world_size, 1, None, world)
    replicas = world.world_size // shards
    mesh = init_device_mesh(world.device.type, (replicas, shards), mesh_dim_names=("replica", "shard"))
    replica, shard = divmod(world.rank, shards)
    outer = replace(world, rank=replica, world_size=replicas, group=mesh.get_group("replica"))
    return ReplicaLayout(replica, shard, replicas, shards, mesh.get_group("shard"), outer, mesh)
