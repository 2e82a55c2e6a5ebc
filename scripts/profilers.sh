#!/usr/bin/env bash
# Installs what the profiling scripts need when it is missing: perf (apt
# package linux-perf) and inferno (cargo install inferno). Sourced by
# scripts/profile.sh and scripts/profile_server.sh.
if ! command -v perf >/dev/null 2>&1; then
    echo "installing perf (linux-perf)" >&2
    apt-get update -qq
    apt-get install -y -qq linux-perf >/dev/null
fi
if ! command -v inferno-flamegraph >/dev/null 2>&1 || ! command -v inferno-collapse-perf >/dev/null 2>&1; then
    echo "installing inferno" >&2
    cargo install --locked inferno
fi
