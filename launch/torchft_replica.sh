#!/usr/bin/env bash
# One replica group of a transport=torchft run, on this host: a torchrun job of
# NPROC ranks that joins the torchft lighthouse at $LIGHTHOUSE as group $REPLICA of $REPLICAS.
# Start the lighthouse once (`torchft_lighthouse --min_replicas 1 --heartbeat_timeout_ms 5000`), then this
# on each group's host; a group may start late (it heals and joins the next quorum) and is
# restarted alone by torchrun up to MAX_RESTARTS times.
#   LIGHTHOUSE=http://host:29510 REPLICA=0 REPLICAS=2 NPROC=8 launch/torchft_replica.sh [overrides]
set -euo pipefail
: "${LIGHTHOUSE:?http://host:port of torchft_lighthouse}" "${REPLICA:?this group's index}" "${REPLICAS:?number of groups}"
NPROC="${NPROC:-1}"
MAX_RESTARTS="${MAX_RESTARTS:-3}"
RUN_DIR="${RUN_DIR:-runs/torchft}"
exec torchrun --standalone --nproc-per-node "$NPROC" --max-restarts "$MAX_RESTARTS" -m recipes.train \
  launcher=torchrun transport=torchft transport.replicas="$REPLICAS" \
  transport.replica_id="$REPLICA" transport.lighthouse="$LIGHTHOUSE" \
  run_dir="$RUN_DIR/replica_$REPLICA" "$@"
