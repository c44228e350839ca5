"""One rank's torchft Manager, and what a replica group changes in the trainer.

torchft, not decentrain, owns membership here: the Lighthouse forms a quorum of the live
replica groups, the Manager reconfigures a gloo process group across them each time the
quorum changes, averages over the groups that participate, and heals a group whose step
is behind from a live peer (the trainer's whole state plus the algorithm's, via state
dict callbacks), before it runs the step or the sync with the others.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from decentrain.algorithms.base import Algorithm
from decentrain.core.registry import Registry
from decentrain.core.world import World
from decentrain.data.blocks import ShardedSampler

log = logging.getLogger(__name__)

# torchft variants of the collective algorithms, by algorithm.name: cls(cfg, world, group, total_steps); each
# refuses in its `check_world` what it cannot carry (called before any worker starts)
FT_ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm.name with transport=torchft")


def torchft_available() -> bool:
    return importlib.util.find_spec("torchft") is not None


@dataclass(frozen=True)
class ReplicaGroup:
    """Which replica group this torchrun job is, of how many, and how its Manager reaches the others: built
    from the `transport` section, where every torchft setting lives (TorchFTConfig.replica_group)."""

    replica_id: int
    replicas: int
    lighthouse: str  # http://host:port of torchft's Lighthouse
    min_replicas: int
    timeout_s: float
    quorum_timeout_s: float
    # the group's own key-value store; None: torchrun's (MASTER_ADDR/MASTER_PORT, read by torchft)
    store_addr: str | None = None
    store_port: int | None = None


def replica_sampler(
    num_blocks: int, batch_per_group: int, world: World, group: ReplicaGroup, seed: int
) -> ShardedSampler:
    """Each replica group reads its own slice of one seeded order (train.global_batch_size is per group).

    Every group advances the shared position by the same amount per step, so a healed group
    that loads a peer's sampler state reads its own next slice, not the peer's.
    """
    rank = group.replica_id * world.world_size + world.rank
    return ShardedSampler(num_blocks, batch_per_group * group.replicas, rank, world.world_size * group.replicas, seed)


HEALED_FROM = "healed_from_group"  # the donor's replica id, added to the heal state it sends


def build_manager(
    world: World,
    group: ReplicaGroup,
    state_dict: Callable[[], Any],
    load_state_dict: Callable[[Any], None],
    use_async_quorum: bool = False,
):
    """torchft.Manager for this rank; its gloo group spans the same rank of every live replica group.

    The intra-group store is torchrun's unless the group names one. The heal state
    travels through SafeHealHTTP (JSON + safetensors), not torchft's pickle-based default.
    """
    from torchft import Manager, ProcessGroupGloo

    from decentrain.algorithms.pretraining.torchft.heal_http import SafeHealHTTP

    timeout = timedelta(seconds=group.timeout_s)

    def tagged_state() -> Any:  # the donor names itself, so that the healed group can say where it came from
        return {**state_dict(), HEALED_FROM: group.replica_id}

    def load_and_say(state: Any) -> None:
        donor = state.pop(HEALED_FROM, None) if isinstance(state, dict) else None
        load_state_dict(state)
        donor = f"group {donor}" if isinstance(donor, int) else "a live group"
        log.warning("replica group %d healed from %s at step %s", group.replica_id, donor, state.get("step", "?"))

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=group.min_replicas,
        load_state_dict=load_and_say,
        state_dict=tagged_state,
        replica_id=f"replica_{group.replica_id}",
        rank=world.rank,
        world_size=world.world_size,
        store_addr=group.store_addr,
        store_port=group.store_port,
        lighthouse_addr=group.lighthouse,
        use_async_quorum=use_async_quorum,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=group.quorum_timeout_s),
        connect_timeout=timeout,
        checkpoint_transport=SafeHealHTTP(timeout),  # torchft's name for its heal channel
    )
    log.info(
        "torchft manager: replica group %d of %d, lighthouse %s", group.replica_id, group.replicas, group.lighthouse
    )
    return manager


def ft_metrics(manager) -> dict[str, float]:
    return {
        "ft/participants": float(manager.num_participants()),
        "ft/committed_steps": float(manager.current_step()),
        "ft/batches_committed": float(manager.batches_committed()),
    }
