#!/usr/bin/env python3
"""Print criterion results of one group as ratios against a baseline.

Usage: scripts/bench_ratios.py GROUP BASELINE [BENCH ...]

Reads target/criterion/GROUP/*/new/estimates.json (written by `cargo bench`)
and prints, for every bench of the group (or those named), its mean time and
its throughput as a fraction of BASELINE's: baseline_time / bench_time. A
ratio of 0.9 means "runs at 90% of the baseline's speed". Both must come
from the same `cargo bench` run, since these machines are noisy.
"""
import json
import pathlib
import sys


def mean_ns(group_dir: pathlib.Path, bench: str) -> float:
    path = group_dir / bench / "new" / "estimates.json"
    with path.open() as f:
        return json.load(f)["mean"]["point_estimate"]


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(__file__).resolve().parent.parent
    group_dir = root / "target" / "criterion" / sys.argv[1]
    baseline = sys.argv[2]
    benches = sys.argv[3:] or sorted(
        p.name for p in group_dir.iterdir() if (p / "new" / "estimates.json").exists()
    )
    base = mean_ns(group_dir, baseline)
    print(f"{sys.argv[1]}: baseline {baseline} = {base / 1e6:.3f} ms")
    for bench in benches:
        t = mean_ns(group_dir, bench)
        print(f"  {bench:<40} {t / 1e6:10.3f} ms   ratio {base / t:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
