#!/usr/bin/env bash
# Start N independent SAPO nodes on this machine that find each other through a hivemind DHT on
# loopback (no NAT probing, no relays). Each node is its own process with its own node_index,
# so `nodes[i]` overrides in the config give it its own model, tokenizer or task mix.
#
#   launch/sapo_swarm.sh 4 runs/swarm model.pretrained=ckpt/sft model.tokenizer=ckpt/sft
#
# Node 0 starts the swarm and writes its addresses to <run_dir>/peers.txt; the others join
# through that file (and append theirs). Stop with Ctrl-C: every node is stopped by its pid.
set -euo pipefail
N=${1:?usage: sapo_swarm.sh N RUN_DIR [hydra overrides...]}
RUN_DIR=${2:?usage: sapo_swarm.sh N RUN_DIR [hydra overrides...]}
shift 2
PYTHON=${PYTHON:-python}
mkdir -p "$RUN_DIR"
PEERS="$RUN_DIR/peers.txt"
rm -f "$PEERS"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-offline} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop INT TERM EXIT

start_node() {
  local i=$1
  shift
  "$PYTHON" -m recipes.rl sapo=hivemind node_index="$i" run_dir="$RUN_DIR" \
    exchange.hivemind.peers_file="$PEERS" "$@" >"$RUN_DIR/node$i.log" 2>&1 &
  pids+=($!)
  echo "node$i pid $! log $RUN_DIR/node$i.log"
}

start_node 0 "${@}"
for _ in $(seq 600); do [[ -s "$PEERS" ]] && break; sleep 0.1; done
[[ -s "$PEERS" ]] || { echo "node0 did not start a DHT; see $RUN_DIR/node0.log" >&2; exit 1; }
for i in $(seq 1 $((N - 1))); do start_node "$i" "${@}"; done
# Every node appends its addresses to peers.txt once its DHT is up: wait until all N have (or warn).
# Node 0 is already running its rounds; until its peers are up it trains on its own groups only.
count_nodes() { grep -o '/p2p/[A-Za-z0-9]*' "$PEERS" 2>/dev/null | sort -u | wc -l; }
for _ in $(seq "${PEER_WAIT_S:-120}"); do (( $(count_nodes) >= N )) && break; sleep 1; done
if (( $(count_nodes) >= N )); then
  echo "swarm: all $N nodes reachable (peers in $PEERS)"
else
  echo "swarm: WARNING only $(count_nodes) of $N nodes reachable after ${PEER_WAIT_S:-120}s; the others' logs: $RUN_DIR/node*.log" >&2
fi
echo "swarm: per-round lines in $RUN_DIR/node*.log; at the end each node writes $RUN_DIR/node<i>/summary.json and reward.png"
wait "${pids[@]}"
