#!/usr/bin/env python3
"""check_layers.py OBJDIR - every call between the library's files goes one way.

Reads the symbols of every object under OBJDIR (nm): file A uses file B when
A leaves undefined a global symbol that B defines. Fails (exit 1) on any
circle, naming its files and the symbols each uses of the next; otherwise
prints the files by level, the lowest (the basics) first: a file uses only
files on lower levels. A lower layer reaches an upper one only through a
function the upper registered with it (entry/wiring.c).
"""
import os
import subprocess
import sys


def symbols(path):
    out = subprocess.run(["nm", "-P", path], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind in ("U", "w", "v"):
            undefined.add(name)
        elif kind.isupper():
            defined.add(name)
    return defined, undefined


def graph(objdir):
    objects = sorted(os.path.join(d, f) for d, _, files in os.walk(objdir)
                     for f in files if f.endswith(".o"))
    if not objects:
        sys.exit(f"check_layers: no objects under {objdir} (not built?)")
    owner, needs = {}, {}
    for path in objects:
        name = os.path.relpath(path, objdir)[:-2]
        defined, undefined = symbols(path)
        needs[name] = undefined
        for sym in defined:
            owner.setdefault(sym, name)
    uses = {a: {} for a in needs}
    for a, undefined in needs.items():
        for sym in undefined:
            b = owner.get(sym)
            if b is not None and b != a:
                uses[a].setdefault(b, []).append(sym)
    return uses


def circles(uses):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in uses[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in sorted(uses):
        if v not in index:
            visit(v)
    return found


def levels(uses):
    level = {}

    def of(v):
        if v not in level:
            level[v] = 1 + max((of(w) for w in uses[v]), default=-1)
        return level[v]

    for v in uses:
        of(v)
    return level


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_layers.py OBJDIR")
    uses = graph(sys.argv[1])
    found = circles(uses)
    if found:
        for part in found:
            print(f"check_layers: a circle of {len(part)} files: {' '.join(part)}")
            for a in part:
                for b in sorted(set(uses[a]) & set(part)):
                    print(f"  {a} -> {b}: {' '.join(sorted(uses[a][b]))}")
        return 1
    level = levels(uses)
    for n in range(max(level.values()) + 1):
        print(f"  level {n}: {' '.join(sorted(v for v in level if level[v] == n))}")
    print(f"check_layers: {len(uses)} files, no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
