#!/usr/bin/env python3
"""Fails when the modules of a workspace crate import each other in a circle.

For every library crate (crates/*/src, python/src) each source file is a module
(`a/b.rs` and `a/b/mod.rs` are `a::b`). Every `crate::...` path in its code
(`use crate::...` lines, braces expanded, and paths written inline) is an import of
the longest module that path names. Imports between a module and its own ancestors
or descendants are containment, not dependencies, and are left out; so are test
modules (`tests.rs` files and what follows `#[cfg(test)]` in a file). A circle is
a strongly connected set of two or more modules: a type in the wrong file.

Usage: scripts/check-module-cycles.py [ROOT]   (exit 1 and the circles on stderr)
"""

import os
import re
import sys


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    return tuple(rel)


def blank(text):
    """The code with comments, strings and char literals blanked (a small Rust scanner)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif c == "r" and re.match(r'r#*"', text[i:]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r"r(#*)", text[i:]).group(1)
            close = '"' + hashes
            j = text.find(close, i + 2 + len(hashes))
            i = n if j < 0 else j + len(close)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.[^']*|[^'\\])'", text[i:]):
            i += len(re.match(r"'(\\.[^']*|[^'\\])'", text[i:]).group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip(text):
    text = blank(text)
    # Test code is not part of the module graph.
    cut = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text, re.M)
    if cut:
        text = text[: cut.start()]
    return text


def expand(tree):
    """`a::{b::C, d}` -> ['a::b::C', 'a::d'] (nested braces too)."""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, body = tree[:i], tree[i + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            out.extend(prefix + q for q in expand(p))
    return out


def imports(text, module):
    """Module paths named by `crate::` and `super::` paths (the latter resolved from `module`)."""
    paths = []
    for m in re.finditer(r"\buse\s+((?:crate|super)::[^;]*);", text, re.S):
        paths.extend(expand(re.sub(r"\s+", "", m.group(1))))
    rest = re.sub(r"\buse\s+(?:crate|super)::[^;]*;", "", text, flags=re.S)
    paths.extend(m.group(1) for m in re.finditer(r"(?<![\w:])((?:crate|super)::(?:\w+::)*\w+)", rest))
    out = []
    for p in paths:
        parts = p.split("::")
        base = list(module)
        if parts[0] == "crate":
            base, parts = [], parts[1:]
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
        out.append(tuple(base + parts))
    return out


def target(path, modules):
    for n in range(len(path), 0, -1):
        if path[:n] in modules:
            return path[:n]
    return None


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def circles(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check_crate(src):
    files = {}
    for dirpath, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs") and name != "tests.rs":
                path = os.path.join(dirpath, name)
                files[module_of(src, path)] = path
    modules = set(files)
    graph = {m: set() for m in modules}
    edges = {}
    for m, path in files.items():
        with open(path, encoding="utf-8") as f:
            text = strip(f.read())
        for p in imports(text, m):
            t = target(p, modules)
            if t is None or related(m, t):
                continue
            graph[m].add(t)
            edges.setdefault((m, t), "::".join(p))
    found = []
    for comp in circles(graph):
        members = set(comp)
        lines = [
            f"    {'::'.join(a) or 'crate'} -> {'::'.join(b)} (crate::{edges[(a, b)]})"
            for a in comp
            for b in sorted(graph[a])
            if b in members
        ]
        found.append(" <-> ".join("::".join(c) or "crate" for c in comp) + "\n" + "\n".join(lines))
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    srcs = [os.path.join(root, "crates", c, "src") for c in sorted(os.listdir(os.path.join(root, "crates")))]
    srcs.append(os.path.join(root, "python", "src"))
    bad = 0
    for src in srcs:
        if not os.path.isdir(src):
            continue
        for c in check_crate(src):
            bad += 1
            print(f"module circle in {os.path.relpath(src, root)}: {c}", file=sys.stderr)
    if bad:
        print(f"{bad} module circle(s): move each shared type to the module that owns it", file=sys.stderr)
        return 1
    print("no module circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
