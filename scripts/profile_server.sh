#!/usr/bin/env bash
# A flame graph (SVG) of a running `replog` under a replog-bench load: what
# holds a throughput goal back, sampled from the server process itself
# rather than from a criterion bench (scripts/profile.sh).
#
#   [REPLICAS=3] scripts/profile_server.sh [BENCH ARGS...]
#
# Starts a release single replica (two shards), or with REPLICAS=3 a
# `replog dev --replicas 3` cluster (three processes), on free loopback
# ports with its data in a temporary directory, runs `replog-bench --addr
# ADDR BENCH ARGS` against it (replica 0; default: the G5 producer goal's
# command, `-m 1000 -p 1000 -b 1000 pinned-producer --producers 4`),
# samples every replica process with perf for the length of the run, and
# writes target/profile/replog-server[-3].svg and .folded; the top frames
# go to stderr. Sampling as in scripts/profile.sh: cpu-clock (no hardware
# counters on this VM), DWARF call graphs, PROFILE_FREQ (default 499) Hz;
# perf and inferno are installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
    args=(-m 1000 -p 1000 -b 1000 pinned-producer --producers 4)
fi
freq=${PROFILE_FREQ:-499}
# shellcheck source=scripts/profilers.sh
source scripts/profilers.sh
cargo build --release --bin replog --bin replog-bench >&2
out=$PWD/target/profile
mkdir -p "$out"
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
replicas=${REPLICAS:-1}
if [[ $replicas == 1 ]]; then
    name=replog-server
    target/release/replog --data-dir "$dir/data" --listen "127.0.0.1:$port" --shards 2 >"$dir/server.log" 2>&1 &
else
    name=replog-server-$replicas
    target/release/replog --data-dir "$dir/data" --shards 2 dev --replicas "$replicas" --base-port "$port" >"$dir/server.log" 2>&1 &
fi
pid=$!
perf_pid=
cleanup() {
    [[ -n $perf_pid ]] && kill -INT "$perf_pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 400); do
    [[ $(grep -c "serving Iggy clients" "$dir/server.log") -ge $replicas ]] && break
    sleep 0.05
done
# The replica processes: the server itself, or `replog dev`'s children.
pids=$pid
if [[ $replicas != 1 ]]; then
    pids=$(pgrep -d, -P "$pid")
fi
perf record -q -e cpu-clock -F "$freq" --call-graph dwarf,16384 -p "$pids" -o "$dir/perf.data" &
perf_pid=$!
sleep 0.5
target/release/replog-bench --addr "127.0.0.1:$port" "${args[@]}"
kill -INT "$perf_pid"
wait "$perf_pid" || true
perf_pid=
perf script -i "$dir/perf.data" 2>/dev/null | inferno-collapse-perf >"$out/$name.folded"
inferno-flamegraph --title "$replicas replog replica(s) under replog-bench ${args[*]} (cpu-clock)" \
    <"$out/$name.folded" >"$out/$name.svg"
python3 scripts/flame_top.py "$out/$name.folded" 15 >&2
echo "$out/$name.svg"
