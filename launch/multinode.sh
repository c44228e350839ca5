#!/usr/bin/env bash
# Several machines (docs/multihost.md). Once per job, on a machine that runs no worker (a login
# or head node; it must outlive the hosts), start the job store:
#   python -m decentrain.core.comm.job_store --port 29400
# then run the same line on every host, each with its own NODE_RANK (0 .. NNODES-1):
#   export DECENTRAIN_JOB_SECRET=<the same secret on every host, e.g. from `openssl rand -hex 32`>
#   NNODES=3 NODE_RANK=0 NPROC=8 STORE=storehost:29400 RUN_ID=myrun launch/multinode.sh algorithm=noloco
# Gossip algorithms (survives_peer_loss: NoLoCo) run as survivors: a host (all its workers) may
# die and its partners lose at most that round's averaging. To add a host in a dead one's place,
# run the same line with the dead host's NODE_RANK on any machine: its workers heal from live
# peers (model, phi, outer momentum, AdamW state, sampler position) and train to the end.
# Collective algorithms (DDP, DiLoCo) run under torch elastic with the same store as rendezvous
# (RDZV, default STORE): one failure restarts every host's workers (MAX_RESTARTS), which resume
# from the last checkpoint with resume=true.
# RUN_ID must match across hosts (default: a fixed id per day, so pass your own when you run
# several jobs at once). If the job store dies, every host stops with one line; start the store
# and the job again with resume=true.
set -euo pipefail
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK (0..NNODES-1)}" "${NPROC:?set NPROC (ranks per node)}"
: "${STORE:?set STORE=host:port of the job store (python -m decentrain.core.comm.job_store)}"
RUN_ID=${RUN_ID:-decentrain-$(date +%Y%m%d)}
MAX_RESTARTS=${MAX_RESTARTS:-3}  # survivors: replacements per rank on this host; elastic: restarts of the group
cd "$(dirname "$0")/.."
exec python -m recipes.train launcher=hosts "launcher.nnodes=$NNODES" "launcher.node_rank=$NODE_RANK" \
  "launcher.nproc_per_node=$NPROC" "launcher.store=$STORE" "launcher.rdzv_endpoint=${RDZV:-$STORE}" \
  "launcher.job_id=$RUN_ID" "launcher.max_restarts=$MAX_RESTARTS" "run_dir=${RUN_DIR:-runs/$RUN_ID}" "$@"
