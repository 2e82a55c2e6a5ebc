#!/usr/bin/env python3
"""The top frames of a folded-stacks file (inferno-collapse-perf output):
the frames with the most samples of their own (self), and the project's
own functions with the most samples beneath them (inclusive).

    scripts/flame_top.py target/profile/storage-log_io.folded [N]

Closures and symbol hashes are folded into their function, so a
function's share is not split across its closures.
"""

import collections
import re
import sys

# The project's crates, and the hashes that carry most of their CPU.
OURS = re.compile(
    r"^<?(common|consensus|journal|metadata|partitions|shard|storage|server)::|xxhash_rust::"
)


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    top = int(sys.argv[2]) if len(sys.argv) == 3 else 10
    own = collections.Counter()
    inclusive = collections.Counter()
    total = 0
    with open(sys.argv[1], encoding="utf-8", errors="replace") as folded:
        for line in folded:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = [re.sub(r"::\{\{closure\}\}|::h[0-9a-f]{16}", "", f) for f in stack.split(";")]
            own[frames[-1]] += n
            for f in set(frames):
                inclusive[f] += n
    if total == 0:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples (weighted)")
    print("self:")
    for frame, n in own.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {frame[:150]}")
    print("inclusive, the project's functions and xxh3:")
    shown = 0
    for frame, n in inclusive.most_common():
        if OURS.search(frame):
            print(f"  {100 * n / total:5.1f}%  {frame[:150]}")
            shown += 1
            if shown == top:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
