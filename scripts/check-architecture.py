#!/usr/bin/env python3
"""Checks that ARCHITECTURE.md's crate table lists every module and no module that is gone.

For each row of the table (`| \`crate\` | ...`), every module file of that crate
(`src/a.rs`, `src/a/b.rs`, `src/a/mod.rs`; tests left out) must be named in the row: its
path (`a/b`) or its own name (`b`) as a word. Every `a/b` path written in backticks in the
row must be a module of the crate. Exit 1 with what is missing or stale.
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DIRS = {"sparta-py": "python", "cli": "crates/cli"}


def modules(src):
    out = set()
    for dirpath, _, names in os.walk(src):
        for n in names:
            if not n.endswith(".rs") or n == "tests.rs":
                continue
            rel = os.path.relpath(os.path.join(dirpath, n), src)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]) or not rel or rel[-1] == "tests":
                continue
            out.add("/".join(rel))
    return out


def main():
    text = open(os.path.join(ROOT, "ARCHITECTURE.md"), encoding="utf-8").read()
    bad = []
    rows = 0
    for line in text.splitlines():
        m = re.match(r"\| `([\w-]+)`(?: \(`python/`\))? \|", line)
        if not m:
            continue
        name = m.group(1)
        src = os.path.join(ROOT, DIRS.get(name, f"crates/{name}"), "src")
        if not os.path.isdir(src):
            continue
        rows += 1
        mods = modules(src)
        for mod in sorted(mods):
            last = mod.split("/")[-1]
            if f"`{mod}`" not in line and f"{mod}" not in line and not re.search(rf"\b{re.escape(last)}\b", line):
                bad.append(f"{name}: module {mod} is not in its ARCHITECTURE.md row")
        for tok in re.findall(r"`([\w/]+)`", line):
            if re.fullmatch(r"\w+(/\w+)+", tok) and not tok.startswith(("proto/", "fuzz_targets", "src/")) and tok not in mods:
                bad.append(f"{name}: ARCHITECTURE.md names `{tok}`, which is no module of the crate")
    if rows < 15:
        bad.append(f"only {rows} crate rows found in ARCHITECTURE.md's table")
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        return 1
    print(f"ARCHITECTURE.md lists every module of {rows} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
