#!/usr/bin/env bash
# Counts, per crate, the fields, parameters and return types whose name says
# they hold an op, an offset, a replica or a group but whose type is a raw
# u64/u8 instead of common::{Op, Offset, ReplicaId, GroupId} (G6 item 1).
# A grep, not a parser: a row is a place to look. Counts, bytes, ticks and
# timestamps are left out. Usage: scripts/raw_ids.sh [CHECKOUT] [--list]
set -euo pipefail
root=${1:-.}
list=${2:-}
cd "$root"
for c in consensus journal partitions metadata shard; do
  hits=$(grep -rnE "^\s*pub [a-z_]+: (u64|u8|Option<u64>|Option<u8>),|^\s*[a-z_]+: (u64|u8|Option<u64>|Option<u8>),|pub fn [a-z_]+\(.*: (u64|u8)\b|pub fn .*-> (u64|u8|Option<u64>|Option<u8>) \{" \
      "core/$c/src" --include=*.rs \
    | grep -vE "/tests?\.rs|mod tests" \
    | grep -E "\b(op|[a-z_]*_op|commit[a-z_]*|[a-z_]*offset[a-z_]*|frontier|replica|peer|primary|requester|group|from|to|local|head|floor|barrier|recorded_point|previous_end|next_start|max)\b *[:(]" \
    | grep -vE "timestamp|_count|_bytes|_ticks|generation|revision|request:|session|round|operation|retention_ops|replication_factor|snapshot_every|len\b|group_visits|groups_not_opened|partition_groups|byte|chunk" || true)
  n=$(printf '%s' "$hits" | grep -c . || true)
  echo "$c raw=$n"
  if [ "$list" = "--list" ] && [ -n "$hits" ]; then printf '%s\n' "$hits" | sed 's/^/  /'; fi
done
