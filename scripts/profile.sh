#!/usr/bin/env bash
# A flame graph (SVG) of one criterion bench, sampled with perf and folded
# with inferno.
#
#   scripts/profile.sh CRATE BENCH [FILTER]
#
# e.g. scripts/profile.sh storage log_io segmented_log/fsync=false
#
# The bench runs in criterion's --profile-time mode (each selected
# benchmark iterates for PROFILE_SECONDS, default 5, with no analysis), so
# the samples are the measured code, not criterion's statistics. The
# output is target/profile/CRATE-BENCH[-FILTER].svg, with the folded
# stacks beside it (.folded, for diffing two runs with
# inferno-diff-folded); perf's raw data is deleted unless KEEP_PERF_DATA=1.
# The top frames (scripts/flame_top.py) are printed on stderr. A
# bench's own paired baselines (raw I/O beside ours) run and are sampled
# too whatever the filter: read the graph from our functions down.
#
# Sampling uses the software event cpu-clock, because a virtual machine
# often has no hardware counters (`perf stat -e instructions true` says
# "not supported"), and DWARF call graphs, because release builds omit
# frame pointers; the bench profile keeps line tables (debug = 1), so the
# frames carry our function names.
#
# Installs what is missing: perf (apt package linux-perf) and inferno
# (cargo install inferno).
#
# Environment:
#   PROFILE_SECONDS  --profile-time per benchmark (default 5)
#   PROFILE_FREQ     samples per second (default 499)
#   KEEP_PERF_DATA   keep target/profile/*.perf.data when set to 1
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
    echo "usage: $0 CRATE BENCH [FILTER]" >&2
    exit 2
fi
crate=$1
bench=$2
filter=${3:-}
seconds=${PROFILE_SECONDS:-5}
freq=${PROFILE_FREQ:-499}

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/profile
mkdir -p "$out"
name=$crate-$bench
if [[ -n $filter ]]; then
    name=$name-$(printf '%s' "$filter" | tr -c 'A-Za-z0-9._=-' '_')
fi

# shellcheck source=scripts/profilers.sh
source "$root/scripts/profilers.sh"

# The bench's executable, built (not run) by cargo.
exe=$(cd "$root" && cargo bench -p "$crate" --bench "$bench" --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
bench = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == bench and "bench" in m["target"]["kind"]:
        print(m["executable"])
' "$bench")
if [[ -z $exe || ! -x $exe ]]; then
    echo "$0: no bench executable for crate $crate bench $bench (cargo bench -p $crate --bench $bench --no-run failed?)" >&2
    exit 1
fi

data=$out/$name.perf.data
args=(--bench --profile-time "$seconds")
if [[ -n $filter ]]; then
    args+=("$filter")
fi
echo "$0: sampling $exe ${args[*]} at $freq Hz" >&2
(cd "$root" && perf record -q -e cpu-clock -F "$freq" --call-graph dwarf,16384 -o "$data" -- "$exe" "${args[@]}" >/dev/null)

perf script -i "$data" 2>/dev/null | inferno-collapse-perf > "$out/$name.folded"
inferno-flamegraph --title "$crate $bench${filter:+ $filter} (cpu-clock, $seconds s per benchmark)" \
    < "$out/$name.folded" > "$out/$name.svg"
if [[ ${KEEP_PERF_DATA:-0} != 1 ]]; then
    rm -f "$data"
fi
python3 "$root/scripts/flame_top.py" "$out/$name.folded" 10 >&2
echo "$out/$name.svg"
