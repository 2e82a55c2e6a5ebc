#!/usr/bin/env bash
# Many partitions on one replica: how long creating them takes, the
# descriptors they hold in use and once idle, idle CPU and memory, the
# metrics endpoint's size (series, bytes, scrape time), and a cold boot of
# them all. Starts its own `replog` on a free loopback port
# (release build) with data in DIR, and stops it on exit.
#
#   scripts/scale.sh [TOPICS] [DIR]
#
# TOPICS topics of 1,000 partitions each (default 10: 10,000 partitions);
# DIR defaults to a new temporary directory, removed afterwards. The cold
# boot drops the page cache when run as root (otherwise it is warm).
set -euo pipefail
cd "$(dirname "$0")/.."

topics=${1:-10}
if ! [[ $topics =~ ^[0-9]+$ ]] || (( topics < 1 )); then
    echo "$0: TOPICS must be a positive integer" >&2
    exit 2
fi
if [[ $# -ge 2 ]]; then
    dir=$2
    keep=1
else
    dir=$(mktemp -d)
    keep=0
fi
cargo build --release --bin replog --bin replog-cli >&2
bin=target/release
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cli() { "$bin/replog-cli" --addr "127.0.0.1:$port" "$@"; }
pid=
start() {
    "$bin/replog" --data-dir "$dir/data" --listen "127.0.0.1:$port" \
        --metrics-listen 127.0.0.1:0 >"$dir/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 1200); do
        grep -q "serving Iggy clients" "$dir/server.log" && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "$0: replog did not start; see $dir/server.log" >&2
    exit 1
}
stop() {
    [[ -n $pid ]] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 240); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null || true
    pid=
}
cleanup() {
    stop
    if (( keep == 0 )); then rm -rf "$dir"; fi
}
trap cleanup EXIT

fds() { find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 | wc -l; }
rss() { awk '/VmRSS/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$pid/status"; }
# Percent of one core used over $1 seconds.
cpu() {
    local hz a b
    hz=$(getconf CLK_TCK)
    a=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    sleep "$1"
    b=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    python3 -c "print(round(($b - $a) / $hz / $1 * 100, 2))"
}
now() { date +%s.%N; }
# One scrape of the metrics endpoint: series (sample lines), bytes, seconds.
scrape() {
    local url
    url=$(grep -o 'metrics on http://[^ ]*' "$dir/server.log" | tail -1 | cut -d' ' -f3)
    python3 - "$url" <<'PY'
import sys, time, urllib.request
t = time.monotonic()
body = urllib.request.urlopen(sys.argv[1], timeout=60).read()
took = time.monotonic() - t
lines = body.decode().splitlines()
series = sum(1 for l in lines if l and not l.startswith("#"))
print(f"{series} series, {len(body)} bytes, scraped in {took:.3f} s")
PY
}
since() { python3 -c "print(round($(now) - $1, 2))"; }

start
partitions=$((topics * 1000))
echo "replog on 127.0.0.1:$port, data in $dir/data, open-file limit $(ulimit -Hn)"
cli stream create scale >/dev/null
t=$(now)
for i in $(seq 1 "$topics"); do
    cli topic create scale "t$i" --partitions 1000 >/dev/null
done
echo "created $partitions partitions in $(since "$t") s; descriptors $(fds)"
peak=0
for _ in $(seq 1 40); do
    f=$(fds)
    (( f > peak )) && peak=$f
    sleep 0.5
done
echo "descriptors: peak $peak, 20 s later $(fds); creates that failed: $(grep -c 'create failed' "$dir/server.log" || true)"
echo "idle: $(cpu 60)% of a core over 60 s, RSS $(rss), descriptors $(fds)"
echo "metrics: $(scrape); again: $(scrape)"
echo hello | cli produce scale "t$topics" --partition 999 >/dev/null
stop
sync
if [[ $(id -u) == 0 ]]; then echo 3 >/proc/sys/vm/drop_caches; fi
t=$(now)
start
echo "boot to serving: $(since "$t") s; partitions opened $(grep -c 'partition booted' "$dir/server.log" || true), left closed $(grep -c 'left closed' "$dir/server.log" || true); descriptors $(fds)"
sleep 10
echo "idle after boot: $(cpu 60)% of a core over 60 s, RSS $(rss), descriptors $(fds)"
got=$(cli consume scale "t$topics" --partition 999 --offset 0 | head -1)
[[ $got == hello ]] || { echo "$0: read back '$got', not 'hello'" >&2; exit 1; }
echo "the message produced before the restart reads back"
