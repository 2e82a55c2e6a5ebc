#!/usr/bin/env bash
# Runs the kill -9 nemesis over real replog processes
# (core/server/tests/nemesis.rs) in release, with a long parameter set:
# by default 36 kill steps for each of the three schedules (rolling,
# connected, whole) in each durability (replicated, persisted), 216 in
# all, one every 3 s, each victim down for 2 s.
#
#   scripts/nemesis.sh
#
# Environment (each defaults as below; see the test's Params::from_env):
#   NEMESIS_SCHEDULES   rolling,connected,whole
#   NEMESIS_DURABILITY  replicated,persisted
#   NEMESIS_KILLS       36 (kill steps per schedule and durability)
#   NEMESIS_PERIOD_MS   3000
#   NEMESIS_DOWN_MS     2000
#   REPLOG_TEST_LOG     the replicas' log filter (the test keeps
#                       warn,shard::shard=info,partitions::boot=info)
#
# The whole output (the replicas' logs included) is kept in
# target/nemesis/last-run.log; the summary lines, one per schedule and
# durability (kills, batches sent and confirmed, lost, re-minted,
# duplicated, reordered, gaps), are printed at the end. Exit status: the
# test's (0 when every schedule kept its promises).
set -euo pipefail

if [[ $# -ne 0 ]]; then
    echo "usage: $0 (parameters through the environment)" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
export NEMESIS_SCHEDULES=${NEMESIS_SCHEDULES:-rolling,connected,whole}
export NEMESIS_DURABILITY=${NEMESIS_DURABILITY:-replicated,persisted}
export NEMESIS_KILLS=${NEMESIS_KILLS:-36}
export NEMESIS_PERIOD_MS=${NEMESIS_PERIOD_MS:-3000}
export NEMESIS_DOWN_MS=${NEMESIS_DOWN_MS:-2000}

target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
out="$target_dir/nemesis"
mkdir -p "$out"
log="$out/last-run.log"

# The test starts the replog binary Cargo builds beside it
# (CARGO_BIN_EXE_replog): in release, the release binary.
cargo build --release --quiet -p server --bin replog --manifest-path "$root/Cargo.toml"
cargo test --release --quiet -p server --test nemesis --manifest-path "$root/Cargo.toml" --no-run

echo "nemesis: schedules=$NEMESIS_SCHEDULES durability=$NEMESIS_DURABILITY kills=$NEMESIS_KILLS" \
    "period=${NEMESIS_PERIOD_MS}ms down=${NEMESIS_DOWN_MS}ms; log in $log"
start=$(date +%s)
set +e
cargo test --release --quiet -p server --test nemesis --manifest-path "$root/Cargo.toml" -- \
    --exact given_kill9_schedules_while_producing_should_keep_every_confirmed_batch_at_its_offset \
    --nocapture >"$log" 2>&1
status=$?
set -e
elapsed=$(($(date +%s) - start))

# The test prints its summary lines once more after "nemesis summary:".
sed -n '/^nemesis summary:/,$p' "$log" | grep '^nemesis ' || true
kills=$(sed -n '/^nemesis summary:/,$p' "$log" |
    sed -n 's/.* kills=\([0-9]*\) .*/\1/p' | awk '{ n += $1 } END { print n + 0 }')
if [[ $status -eq 0 ]]; then
    echo "nemesis: clean, $kills kill steps in ${elapsed}s"
else
    # The broken promises, as the test's final assertion lists them.
    sed -n '/^broken: \[/,/^\]/p' "$log" | grep -v '^broken\|^\]' || true
    echo "nemesis: FAILED (exit $status), $kills kill steps in ${elapsed}s; see $log"
fi
exit "$status"
