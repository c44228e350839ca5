"""Two gossip jobs run one after the other in one process group (a resume in place, a sweep, HDEE
lanes) never read each other's membership, pair-group or heal keys: the second job once read "partner
finished" left by the first, skipped its partner, and the pair-group rendezvous dialled dead addresses."""

import time

import pytest
import torch

from decentrain.testing import run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]  # above run_ranks' 300 s

JOBS, ROUNDS = 8, 3


def _jobs_back_to_back(world):
    from decentrain.core.comm.dist_transport import GossipOptions, TorchTransport

    rows = []
    for job in range(JOBS):
        if world.rank == 1 and job % 2:
            time.sleep(0.3)  # the ranks start each job at different times, as real ones do
        # stall_s long: a partner whose heartbeat a loaded box holds back for seconds is not a stalled one
        transport = TorchTransport(world).start_gossip(GossipOptions(deadline_s=60.0, stall_s=30.0))
        transport.publish(0)
        for r in range(ROUNDS):
            got = transport.exchange([torch.full((4,), float(10 * job + world.rank))], (0, 1), r)
            rows.append(None if got is None else float(got[0][0][0]))
            transport.publish(r + 1)
        stats = transport.stats
        transport.finish(ROUNDS)
        transport.close()
        rows.append((stats.partner_skipped, stats.dropped))
    return rows


def test_back_to_back_gossip_jobs_in_one_group_keep_to_their_own_keys():
    results = run_ranks(_jobs_back_to_back, 2, timeout=300)
    for rank, rows in enumerate(results):
        other = 1 - rank
        for job in range(JOBS):
            chunk = rows[job * (ROUNDS + 1) : (job + 1) * (ROUNDS + 1)]
            assert chunk[:ROUNDS] == [float(10 * job + other)] * ROUNDS, f"rank {rank}, job {job}: {chunk}"
            assert chunk[ROUNDS] == (0, 0), f"rank {rank}, job {job}: skipped/dropped {chunk[ROUNDS]}"
