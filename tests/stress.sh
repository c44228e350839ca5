#!/usr/bin/env bash
# The README's test command under load: 2 busy processes hold the cores while the suite runs,
# as on a shared CI box. A test that depends on which process gets the CPU first fails here.
#
#   tests/stress.sh [REPETITIONS]    (default 1; stops at the first red run)
#
# Prints each run's pytest summary line; exits with the first failing run's status.
set -uo pipefail
cd "$(dirname "$0")/.."
reps=${1:-1}
busy=()
stop_busy() {
    for pid in "${busy[@]}"; do
        kill "$pid" 2>/dev/null
    done
    wait "${busy[@]}" 2>/dev/null
    busy=()
}
trap stop_busy EXIT
trap 'stop_busy; exit 130' INT TERM
for _ in 1 2; do
    python -c 'while True: pass' &
    busy+=("$!")
done
status=0
for ((i = 1; i <= reps; i++)); do
    log=$(mktemp -t decentrain-stress.XXXXXX)
    start=$(date +%s)
    python -m pytest -q >"$log" 2>&1
    status=$?
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|^=+ .*(passed|failed|error).* =+$' "$log" | tail -1)
    echo "run $i/$reps: exit $status, $(( $(date +%s) - start )) s wall: ${summary:-<no summary; see $log>}"
    if [ "$status" -ne 0 ]; then
        grep -E '^(FAILED|ERROR) ' "$log"
        echo "full log: $log"
        break
    fi
    rm -f "$log"
done
exit "$status"
