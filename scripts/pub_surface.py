#!/usr/bin/env python3
"""Count each crate's public surface, for tracking it over time.

Usage: scripts/pub_surface.py [ROOT]

For every crate under core/, walks from lib.rs through `pub mod`
declarations (files and mod.rs directories) and prints:

- pub mods:   public modules reachable from lib.rs;
- items:      top-level `pub` fn/struct/enum/trait/type/const/static items
              in those modules (lib.rs included);
- re-exports: names in `pub use` lines of the files walked.

A textual approximation (no macro expansion, no `pub(crate)`), meant for
before/after comparisons with the same script, not as an exact API count.
"""
import os
import re
import sys

ITEM = re.compile(r'^pub (?:async )?(?:unsafe )?(fn|struct|enum|trait|type|const|static|union) ')
PUB_MOD = re.compile(r'^pub mod (\w+)\s*;')


def module_file(dirpath, name):
    for candidate in (os.path.join(dirpath, name + '.rs'),
                      os.path.join(dirpath, name, 'mod.rs')):
        if os.path.isfile(candidate):
            return candidate
    return None


def reexported_names(text):
    count = 0
    for m in re.finditer(r'^pub use ([^;]+);', text, re.M):
        body = m.group(1)
        if '{' in body:
            inner = body[body.index('{') + 1:body.rindex('}')]
            names = [n for n in re.split(r'[,\s]+', inner) if n and n != 'self']
            # "A as B" reads as three tokens for one name.
            count += len(names) - 2 * names.count('as')
        else:
            count += 1
    return count


def walk(path, dirpath, seen):
    """Returns (items, pub mods) reachable from `path`; fills `seen`."""
    if path in seen:
        return 0, 0
    seen.add(path)
    items = mods = 0
    with open(path) as f:
        for line in f:
            if ITEM.match(line):
                items += 1
            m = PUB_MOD.match(line)
            if m:
                mods += 1
                child = module_file(dirpath, m.group(1))
                if child:
                    child_dir = (os.path.dirname(child) if child.endswith('mod.rs')
                                 else os.path.join(dirpath, m.group(1)))
                    i, n = walk(child, child_dir, seen)
                    items += i
                    mods += n
    return items, mods


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    core = os.path.join(root, 'core')
    crates = sorted(d for d in os.listdir(core)
                    if os.path.isfile(os.path.join(core, d, 'src', 'lib.rs')))
    totals = [0, 0, 0]
    print(f"{'crate':12} {'pub mods':>8} {'items':>6} {'re-exports':>10} {'total':>6}")
    for crate in crates:
        src = os.path.join(core, crate, 'src')
        seen = set()
        items, mods = walk(os.path.join(src, 'lib.rs'), src, seen)
        uses = sum(reexported_names(open(p).read()) for p in seen)
        print(f"{crate:12} {mods:8} {items:6} {uses:10} {mods + items + uses:6}")
        totals[0] += mods
        totals[1] += items
        totals[2] += uses
    print(f"{'all':12} {totals[0]:8} {totals[1]:6} {totals[2]:10} {sum(totals):6}")


if __name__ == '__main__':
    main()
