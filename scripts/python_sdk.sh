#!/usr/bin/env bash
# Runs a Python program with the Apache Iggy Python SDK (apache-iggy 0.9.0
# from PyPI, itself built on the Rust SDK).
#
#   scripts/python_sdk.sh PROGRAM.py [ARGS...]
#
# The SDK lives in a venv under the cargo target directory
# ($CARGO_TARGET_DIR, else target/ of the repository), made and installed on
# first use and reused afterwards. PYTHON picks the interpreter (python3).
# Exits 3, saying why, when the venv cannot be made or pip cannot install
# the package (no pip, no network): callers must not mistake that for a pass.
set -euo pipefail

VERSION=0.9.0
if [ $# -lt 1 ]; then
    echo "usage: $0 PROGRAM.py [ARGS...]" >&2
    exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
venv="$target/python-sdk/apache-iggy-$VERSION"
python="${PYTHON:-python3}"

installed() {
    "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('apache-iggy') != '$VERSION')" 2>/dev/null
}

if ! installed; then
    mkdir -p "$(dirname "$venv")"
    if ! "$python" -m venv "$venv"; then
        echo "python_sdk.sh: cannot create a venv at $venv with $python" >&2
        exit 3
    fi
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "apache-iggy==$VERSION"; then
        echo "python_sdk.sh: pip could not install apache-iggy==$VERSION (is PyPI reachable?)" >&2
        exit 3
    fi
fi
exec "$venv/bin/python" "$@"
