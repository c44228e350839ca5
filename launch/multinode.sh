#!/usr/bin/env bash
# Several machines, c10d rendezvous. Run the same line on every node:
#   NNODES=2 NPROC=8 RDZV=node0.example:29500 launch/multinode.sh algorithm=noloco
# RDZV must be reachable from every node; RUN_ID must match across nodes (default: a
# fixed id per day, so pass your own when you run several jobs at once).
set -euo pipefail
: "${NNODES:?set NNODES}" "${NPROC:?set NPROC (ranks per node)}" "${RDZV:?set RDZV=host:port}"
RUN_ID=${RUN_ID:-decentrain-$(date +%Y%m%d)}
MAX_RESTARTS=${MAX_RESTARTS:-3}  # with resume=true a restarted job continues from its last checkpoint
cd "$(dirname "$0")/.."
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC" --rdzv-backend c10d --rdzv-endpoint "$RDZV" \
  --rdzv-id "$RUN_ID" --max-restarts "$MAX_RESTARTS" -m recipes.train launcher=torchrun "run_dir=${RUN_DIR:-runs/$RUN_ID}" "$@"
