#!/usr/bin/env bash
# Runs replog-sim over COUNT consecutive seeds from BASE (default 0) in
# parallel processes and lists the failures.
#
#   scripts/sim.sh COUNT [BASE]
#
# Environment:
#   SIM_JOBS     parallel processes (default: the number of cores)
#   SIM_ARGS     extra replog-sim arguments, e.g. "--faults crash --replicas 5"
#   SIM_PROFILE  cargo profile to build with (default: dev; a seed of the
#                default length takes about 0.1 s there)
#
# Each failing seed's full report (property, replay command, last events)
# is kept in target/sim-failures/<seed>.txt, each clean seed's summary
# line in target/sim-failures/last-run-clean.txt; the last line totals
# the fault and transfer counters of the clean seeds. Exit status: 0 when
# every seed ran clean, 1 when any failed.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 COUNT [BASE]" >&2
    exit 2
fi
count=$1
base=${2:-0}
if ! [[ $count =~ ^[0-9]+$ && $base =~ ^[0-9]+$ ]]; then
    echo "$0: COUNT and BASE must be non-negative integers" >&2
    exit 2
fi
jobs=${SIM_JOBS:-$(nproc)}
profile=${SIM_PROFILE:-dev}
root=$(cd "$(dirname "$0")/.." && pwd)

cargo build --quiet --profile "$profile" -p simulator --bin replog-sim --manifest-path "$root/Cargo.toml"
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
case $profile in
    dev) bin_dir=debug ;;
    *) bin_dir=$profile ;;
esac
bin="$target_dir/$bin_dir/replog-sim"
failures="$target_dir/sim-failures"
mkdir -p "$failures"

clean="$failures/last-run-clean.txt"
: > "$clean"
export bin failures clean SIM_ARGS
start=$(date +%s)
# shellcheck disable=SC2016
seq "$base" $((base + count - 1)) | xargs -P "$jobs" -I{} bash -c '
    seed={}
    # shellcheck disable=SC2086
    if out=$("$bin" --seed "$seed" ${SIM_ARGS:-} 2>/dev/null); then
        printf "%s\n" "$out" >> "$clean"
    else
        printf "%s\n" "$out" > "$failures/$seed.txt"
        echo "FAIL seed $seed: $(head -n 1 <<<"$out")"
    fi
' | tee "$failures/last-run.txt"
elapsed=$(( $(date +%s) - start ))
failed=$(grep -c '^FAIL' "$failures/last-run.txt" || true)
echo "seeds $base..$((base + count - 1)): $failed failed in ${elapsed}s (${SIM_ARGS:-default options}); reports in $failures"
# Totals over the clean seeds' summaries (key=value fields).
awk '{
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] ~ /^(crashes|restarts|disk_faults|partitions|wipes|rejoin_crashes|wiped_reboots|blackouts|outages|outage_acks|transfers|metadata_transfers|read_backs|slow_disks|beyond_f|stalled|purges|topic_deletes|stream_deletes|expired)$/) {
            sum[kv[1]] += kv[2]
            if (kv[2] > 0) seeds[kv[1]]++
        }
    }
}
END {
    line = "clean seeds " NR ":"
    n = split("crashes restarts disk_faults partitions wipes rejoin_crashes wiped_reboots blackouts outages outage_acks transfers metadata_transfers read_backs slow_disks beyond_f stalled purges topic_deletes stream_deletes expired", keys, " ")
    for (k = 1; k <= n; k++) line = line " " keys[k] "=" sum[keys[k]] + 0 " (in " seeds[keys[k]] + 0 " seeds)"
    print line
}' "$clean"
[[ $failed -eq 0 ]]
