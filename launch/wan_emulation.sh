#!/usr/bin/env bash
# Emulated WAN links for N local workers (for benchmarks/comm_sync and manual tests).
#
# Install (Debian, as root):
#   apt-get install -y iproute2 iptables libnetfilter-queue-dev iputils-ping
#   pip install NetfilterQueue          # into the env of $PYTHON; only needed for DELAY_MS > 0
#
# Usage (root):
#   launch/wan_emulation.sh up N RATE [DELAY_MS]   e.g. `up 4 100mbit 50`
#   launch/wan_emulation.sh exec I CMD...          run CMD in worker I's namespace
#   launch/wan_emulation.sh status
#   launch/wan_emulation.sh down
#
# Layout: worker i lives in netns ${WAN_PREFIX}i (dt0, dt1, ...) with eth0 = 10.77.0.(i+1)/24.
# Its veth peer is a port of bridge br0 inside netns ${WAN_PREFIX}br. Nothing is created in
# the root namespace and no namespace has a route beyond 10.77.0.0/24, so emulated traffic
# can only flow between these namespaces.
#   - RATE (tc units, e.g. 100mbit) caps each worker's uplink with `tc tbf` on its eth0.
#   - DELAY_MS is added one way on each worker's ingress (so RTT = 2*DELAY_MS): the kernel
#     has no netem, so an iptables NFQUEUE rule hands incoming packets to launch/delay_line.py,
#     which holds each one for DELAY_MS and accepts it in order. Measure RTT with `ping -U`
#     (or from an application): plain ping timestamps replies before the INPUT hook, so it
#     shows only half the added delay.
# Env: WAN_PREFIX (default dt; use another to run two setups side by side), PYTHON (for
# delay_line.py; default the repo's .venv), TBF_BURST (default 32kb), TBF_LATENCY (default 100ms).
set -Eeuo pipefail

PREFIX=${WAN_PREFIX:-dt}
BR_NS=${PREFIX}br
SUBNET=10.77.0
STATE=/run/decentrain-wan-${PREFIX}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x $HERE/../.venv/bin/python ]] && PYTHON=$HERE/../.venv/bin/python
fi
TBF_BURST=${TBF_BURST:-32kb}
TBF_LATENCY=${TBF_LATENCY:-100ms}

die() { echo "wan_emulation: $*" >&2; exit 1; }
usage() { grep '^#   launch/wan_emulation.sh' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }

# Delay-line pids are checked against their command line before any kill, so a recycled pid
# belonging to someone else is never signalled.
is_delay_line() { [[ -r /proc/$1/cmdline ]] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q "delay_line.py"; }

up() {
  (( $# >= 2 )) || usage
  local n=$1 rate=$2 delay=${3:-0} i
  [[ $n =~ ^[0-9]+$ ]] && (( n >= 1 && n <= 250 )) || die "N=$n must be an integer in [1, 250]"
  [[ $delay =~ ^[0-9]+([.][0-9]+)?$ ]] || die "DELAY_MS=$delay must be a non-negative number"
  [[ $EUID -eq 0 ]] || die "must run as root"
  [[ -e $STATE ]] && die "already up ($STATE exists); run '$0 down' first"
  local need_delay=0
  [[ $delay =~ [1-9] ]] && need_delay=1  # any non-zero digit: DELAY_MS > 0
  if (( need_delay )); then
    command -v iptables >/dev/null || die "iptables missing: apt-get install -y iptables libnetfilter-queue-dev"
    "$PYTHON" -c "import netfilterqueue" 2>/dev/null \
      || die "$PYTHON cannot import netfilterqueue: pip install NetfilterQueue"
  fi

  mkdir -p "$STATE"
  # Any failure (or Ctrl-C) from here on tears down whatever was built so far.
  trap 'rc=$?; trap - EXIT; if (( rc )); then echo "wan_emulation: up failed, cleaning up" >&2; down; fi; exit $rc' EXIT
  trap 'exit 130' INT TERM
  echo "$n $rate $delay" >"$STATE/config"

  ip netns add "$BR_NS"
  echo "$BR_NS" >>"$STATE/namespaces"
  ip -n "$BR_NS" link set lo up
  ip -n "$BR_NS" link add br0 type bridge
  ip -n "$BR_NS" link set br0 up
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX$i
    ip netns add "$ns"
    echo "$ns" >>"$STATE/namespaces"
    ip -n "$BR_NS" link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n "$BR_NS" link set "v$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$TBF_BURST" latency "$TBF_LATENCY"
    if (( need_delay )); then
      # Start the listener before the rule: queued packets with no listener are dropped.
      ip netns exec "$ns" setsid "$PYTHON" "$HERE/delay_line.py" --queue 0 --delay-ms "$delay" \
        </dev/null >"$STATE/delay$i.log" 2>&1 &
      echo $! >"$STATE/delay$i.pid"
      wait_ready "$i"
      ip netns exec "$ns" iptables -A INPUT -i eth0 -j NFQUEUE --queue-num 0
    fi
  done
  trap - EXIT INT TERM
  echo "up: $n workers ${PREFIX}0..${PREFIX}$((n - 1)) at $SUBNET.1..$SUBNET.$n, uplink $rate, delay ${delay} ms each way"
}

wait_ready() {
  local i=$1 pid
  pid=$(<"$STATE/delay$i.pid")
  for _ in $(seq 100); do
    grep -q "delay_line ready" "$STATE/delay$i.log" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || die "delay line $i exited: $(cat "$STATE/delay$i.log")"
    sleep 0.1
  done
  die "delay line $i not ready after 10 s"
}

down() {
  local f pid ns
  for f in "$STATE"/delay*.pid; do
    [[ -e $f ]] || continue
    pid=$(<"$f")
    if is_delay_line "$pid"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 30); do is_delay_line "$pid" || break; sleep 0.1; done
      is_delay_line "$pid" && kill -9 "$pid" 2>/dev/null || true
    fi
  done
  # Worker namespaces first, bridge last (deleting a namespace removes its veth pair).
  if [[ -e $STATE/namespaces ]]; then
    for ns in $(tac "$STATE/namespaces"); do
      ip netns del "$ns" 2>/dev/null || true
    done
  fi
  rm -rf "$STATE"
}

status() {
  [[ -e $STATE/config ]] || { echo "down (no $STATE)"; return 0; }
  local n rate delay i pid
  read -r n rate delay <"$STATE/config"
  echo "up: $n workers, uplink $rate, delay ${delay} ms each way, state in $STATE"
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX$i line
    line="$ns $(ip -n "$ns" -br addr show dev eth0 2>/dev/null | awk '{print $3}')"
    line+=" | $(tc -n "$ns" qdisc show dev eth0 2>/dev/null | head -1)"
    if [[ -e $STATE/delay$i.pid ]]; then
      pid=$(<"$STATE/delay$i.pid")
      if is_delay_line "$pid"; then line+=" | delay line pid $pid"; else line+=" | delay line DEAD"; fi
    fi
    echo "$line"
  done
}

cmd=${1:-}
shift || true
case $cmd in
  up) up "$@" ;;
  down) down ;;
  status) status ;;
  exec)
    (( $# >= 2 )) || usage
    i=$1; shift
    exec ip netns exec "$PREFIX$i" "$@" ;;
  *) usage ;;
esac
