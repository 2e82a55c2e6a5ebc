#!/usr/bin/env bash
# The G5 goal table of docs/benchmarks.md in one run: every row's
# replog-bench command against release builds on this machine, in one
# session, each figure beside the baseline it is judged against.
#
#   scripts/goals.sh [DIR]
#
# DIR (default: a new temporary directory, removed afterwards) holds the
# replicas' data and logs and each run's JSON report (kept when DIR is
# given). Starts its own single replica and `replog dev --replicas 3`
# cluster on free loopback ports and stops them on exit. Run it on a quiet
# machine: every figure is a throughput or a latency. About 10 minutes.
#
# Environment: PAIRS (default 3) alternated baseline / replog pairs;
# TRANSFER_SIZE (default 2GiB); FAILOVER_PARTITIONS (default 1000).
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=${PAIRS:-3}
transfer_size=${TRANSFER_SIZE:-2GiB}
failover_partitions=${FAILOVER_PARTITIONS:-1000}
if [[ $# -ge 1 ]]; then
    dir=$1
    keep=1
    mkdir -p "$dir"
else
    dir=$(mktemp -d)
    keep=0
fi
cargo build --release --bin replog --bin replog-bench >&2
bin=$PWD/target/release
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do
        for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if (( keep == 0 )); then rm -rf "$dir"; fi
}
trap cleanup EXIT

# Fresh pages on this VM write at a fraction of the speed of recycled
# ones (docs/tools.md): write and delete 1.6 GB before each run.
warm() {
    dd if=/dev/zero of="$dir/warm" bs=1M count=1600 status=none
    rm -f "$dir/warm"
}
# Starts `replog ARGS` with its output in LOG; waits for its serving line.
start() {
    local log=$1
    shift
    "$bin/replog" "$@" >"$log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 1200); do
        if [[ $(grep -c "serving Iggy clients" "$log") -ge ${want_serving:-1} ]]; then return 0; fi
        sleep 0.05
    done
    echo "$0: replog did not start; see $log" >&2
    exit 1
}
# One bench run: NAME, then its arguments; prints its summary lines.
n=0
bench() {
    local name=$1
    shift
    n=$((n + 1))
    warm
    "$bin/replog-bench" --json "$dir/$n-$name.json" "$@" >"$dir/$n-$name.txt" 2>"$dir/$n-$name.err" || {
        echo "$name failed:" >&2
        cat "$dir/$n-$name.err" >&2
        exit 1
    }
    echo "## $name: replog-bench $*"
    grep -E "^(total|  [0-9]+ samples|produce accepted|   |over|survivors|catch-up|disk|killed|fill)" "$dir/$n-$name.txt" || true
}

echo "# replog goals, $(date -u +%F), $(nproc) cores, release build $(git rev-parse --short HEAD)"
shape=(-m 1000 -p 1000 -b 250 -w 200ms)

# One replica, two shards.
port=$(free_port)
start "$dir/one.log" --data-dir "$dir/one" --listen "127.0.0.1:$port" --shards 2
one=(--addr "127.0.0.1:$port")
for i in $(seq 1 "$pairs"); do
    bench "baseline-$i" "${shape[@]}" baseline --producers 4 --dir "$dir"
    bench "producers-$i" "${one[@]}" "${shape[@]}" --cleanup pinned-producer --producers 4
done
bench consumers "${one[@]}" "${shape[@]}" --cleanup pinned-consumer --consumers 4
bench persisted "${one[@]}" "${shape[@]}" --cleanup --durability persisted pinned-producer --producers 4
bench e2e-one "${one[@]}" -m 1000 -p 100 -b 1000 --rate 100MB -w 1s --cleanup end-to-end --producers 1
bench producers-one-again "${one[@]}" "${shape[@]}" --cleanup pinned-producer --producers 4

# Three replicas (three processes on this machine), two shards each.
base=$(free_port)
want_serving=3 start "$dir/three.log" --data-dir "$dir/three" --shards 2 dev --replicas 3 --base-port "$base"
three=(--addr "127.0.0.1:$base")
bench producers-three "${three[@]}" "${shape[@]}" --cleanup pinned-producer --producers 4
bench e2e-three-persisted "${three[@]}" -m 1000 -p 100 -b 1000 --rate 100MB -w 1s --cleanup --durability persisted end-to-end --producers 1
kill -TERM "${pids[-1]}"

# The cluster modes start their own replicas.
bench transfer -m 1000 -p 1000 transfer --size "$transfer_size" --dir "$dir" --replog "$bin/replog"
bench failover -m 1000 -p 100 failover --partitions "$failover_partitions" --producers 0 --dir "$dir" --replog "$bin/replog"
echo "# reports in $dir$( (( keep == 0 )) && echo ' (removed)')"
