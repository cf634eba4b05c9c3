#!/usr/bin/env python3
"""check_layers.py [--order LAYERS --src SRC [--cc CC --cflags FLAGS] [--tests DIR]] OBJDIR

Every call and include between the library's files goes one way, down.

The calls: file A uses file B when A's object (under OBJDIR) leaves undefined
a global symbol that B's defines (nm). Without --order it fails (exit 1) on
any circle, naming its files and the symbols each uses of the next; otherwise
prints the files by level, the lowest (the basics) first.

With --order, LAYERS (shim/layers.txt) declares the folders top to bottom,
peers (neither uses the other) on one line, and it also fails on:
  - a call from a folder to one above it or to a peer; a folder not declared;
  - an include (#include "x.h", looked up beside the file, then in SRC and
    each declared folder) of a folder above or of a peer, or of another
    folder's header other than its interface, <folder>.h; a header name
    that two folders both use;
  - a circle through headers: each header of SRC is compiled alone (CC,
    FLAGS, -I for SRC and its folders,
    -fkeep-inline-functions) and its inline code's calls join the
    includes and the calls in one graph; a circle in it that holds two .c
    files fails (it is one, whichever file's object shows it);
  - a circle of files, within a folder too, through their calls and their
    includes of each other's private headers (X_impl.h beside X.c is X's;
    <folder>_impl.h, an interface and a header beside no file of its name
    are nobody's);
  - a name a folder's interface (a header not named *_impl.h) declares
    IPCC_HIDDEN that no object of another folder uses, no file under a
    --tests folder names and none of the header's macros or inline code
    uses: it belongs in the folder's *_impl.h, or is static.
    The top folder's header is exempt: no folder stands above to use it.
A lower layer reaches an upper one only through a function the upper
registered with it (entry/wiring.c).
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
HIDDEN = re.compile(r"^IPCC_HIDDEN\b([^;{]*)", re.M)


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


def objects_of(objdir, src=None):
    """Each object's undefined symbols, each symbol's defining object; with
    src, an object left over from a file since moved or removed is skipped."""
    objects = sorted(os.path.join(d, f) for d, _, files in os.walk(objdir)
                     for f in files if f.endswith(".o"))
    if src:
        objects = [o for o in objects if any(
            os.path.exists(os.path.join(src, os.path.relpath(o, objdir)[:-2] + ext))
            for ext in (".c", ".S"))]
    if not objects:
        sys.exit(f"check_layers: no objects under {objdir} (not built?)")
    needs, owner = {}, {}
    for path in objects:
        name = os.path.relpath(path, objdir)[:-2]
        defined, undefined = symbols(path)
        needs[name] = undefined
        for sym in defined:
            owner.setdefault(sym, name)
    return needs, owner


def edges(needs, owner):
    uses = {a: {} for a in needs}
    for a, undefined in needs.items():
        for sym in undefined:
            b = owner.get(sym)
            if b is not None and b != a:
                uses[a].setdefault(b, []).append(sym)
    return uses


def graph(objdir):
    return edges(*objects_of(objdir))


def circles(uses):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in uses.get(v, ()):
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


def read_order(path):
    """The folders' ranks (0 the top; peers share one)."""
    rank = {}
    with open(path) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            n = len(set(rank.values()))
            for folder in words:
                rank[folder] = n
    return rank


def folder(node):
    return node.split("/", 1)[0]


def sources(src):
    """Each .c and .h under src, by node name (folder/stem, folder/name.h)."""
    files = {}
    for d, _, names in os.walk(src):
        for n in sorted(names):
            if n.endswith((".c", ".h")):
                path = os.path.join(d, n)
                rel = os.path.relpath(path, src)
                files[rel[:-2] if n.endswith(".c") else rel] = path
    return files


def includes(files, findings):
    """Include edges node -> header node, each resolved as the compiler would."""
    by_name = {}
    for node in files:
        if node.endswith(".h"):
            by_name.setdefault(os.path.basename(node), []).append(node)
    for name, nodes in sorted(by_name.items()):
        if len(nodes) > 1:
            findings.append(f"two headers named {name}: {' '.join(nodes)}")
    inc = {}
    for node, path in files.items():
        with open(path, errors="replace") as f:
            text = f.read()
        for name in INCLUDE.findall(text):
            here = os.path.join(folder(node), name) if "/" in node else name
            target = here if here in files else None
            if target is None and len(by_name.get(os.path.basename(name), [])) == 1:
                target = by_name[os.path.basename(name)][0]
            if target is not None:
                inc.setdefault(node, set()).add(target)
    return inc


def inline_edges(files, owner, cc, cflags):
    """Header -> the files its inline code calls, from the header compiled alone."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for node, path in sorted(files.items()):
            if not node.endswith(".h"):
                continue
            obj = os.path.join(tmp, "h.o")
            run = subprocess.run(cc + ["-x", "c", "-c", "-fkeep-inline-functions"] + cflags +
                                 ["-o", obj, path], capture_output=True, text=True)
            if run.returncode != 0:
                out[node] = None
                first = (run.stderr.strip().splitlines() or ["?"])[0]
                print(f"check_layers: {node} does not compile alone: {first}")
                continue
            _, undefined = symbols(obj)
            for sym in undefined:
                b = owner.get(sym)
                if b is not None:
                    out.setdefault(node, {}).setdefault(b, []).append(sym)
    return out


def declared(path):
    """The names a header declares IPCC_HIDDEN (functions, then variables)."""
    with open(path, errors="replace") as f:
        text = f.read()
    names = []
    for m in HIDDEN.finditer(text):
        decl = re.sub(r"__attribute__\s*\(\(.*?\)\)", "", m.group(1), flags=re.S)
        hit = re.search(r"(\w+)\s*\(", decl) or re.search(r"(\w+)\s*(?:\[|$)", decl.strip())
        if hit:
            names.append(hit.group(1))
    return names


def unshared(files, needs, owner, rank, tests):
    """Interface names no other folder uses and no test names."""
    top = min(rank.values(), default=0)
    named = ""
    for d in tests or []:
        for base, _, names in os.walk(d):
            for n in names:
                if n.endswith((".c", ".h")):
                    with open(os.path.join(base, n), errors="replace") as f:
                        named += f.read()
    out = []
    for node, path in sorted(files.items()):
        f = folder(node)
        if not node.endswith(".h") or node.endswith("_impl.h") or "/" not in node or rank.get(f) == top:
            continue
        with open(path, errors="replace") as h:
            own = h.read()
        for name in declared(path):
            # One the header's own macros or inline code use is theirs users'.
            if len(re.findall(r"\b%s\b" % re.escape(name), own)) > 1:
                continue
            used = any(folder(a) != f and name in need for a, need in needs.items())
            if not used and not re.search(r"\b%s\b" % re.escape(name), named):
                out.append(f"{node} declares {name}, which no other folder uses: "
                           f"its place is {f}/{f}_impl.h, or static")
    return out


def owned_headers(files):
    """Header node -> the file it belongs to: X_impl.h beside X.c, unless X
    is the folder (<folder>_impl.h is the folder's private part). An
    interface (X.h) declares for whoever uses it."""
    own = {}
    for node in files:
        if node.endswith("_impl.h") and "/" in node:
            stem = node[:-len("_impl.h")]
            if stem in files and os.path.basename(stem) != folder(node):
                own[node] = stem
    return own


def file_edges(files, inc, uses):
    """Calls, and includes (direct or through other headers) of a header
    that another file owns: a file that includes B.h or B_impl.h uses B."""
    own = owned_headers(files)
    out = {a: {b: list(why) for b, why in uses.get(a, {}).items()}
           for a in files if not a.endswith(".h")}
    for a in out:
        seen, todo = set(), list(inc.get(a, ()))
        while todo:
            h = todo.pop()
            if h in seen:
                continue
            seen.add(h)
            todo.extend(inc.get(h, ()))
            b = own.get(h)
            if b and b != a:
                out[a].setdefault(b, []).append(os.path.basename(h))
    return out


def check_order(args, uses, owner, needs):
    rank = read_order(args.order)
    findings = []

    def judge(what, a, b, detail):
        fa, fb = folder(a), folder(b)
        if fa == fb:
            return
        for f in (fa, fb):
            if f not in rank:
                findings.append(f"folder {f} is not in {args.order}")
                rank[f] = -1
        if rank[fb] < rank[fa]:
            findings.append(f"upward {what} {a} -> {b}: {detail}")
        elif rank[fb] == rank[fa]:
            findings.append(f"{what} between peers {a} -> {b}: {detail}")

    for f in sorted({folder(a) for a in uses if "/" in a} - set(rank)):
        findings.append(f"folder {f} is not in {args.order}")
        rank[f] = -1
    for a in sorted(uses):
        for b in sorted(uses[a]):
            judge("call", a, b, " ".join(sorted(uses[a][b])))
    files = sources(args.src)
    dirs = {folder(n) for n in files if "/" in n}
    inc = includes(files, findings)
    for a in sorted(inc):
        for b in sorted(inc[a]):
            judge("include", a, b, os.path.basename(b))
            if folder(a) != folder(b) and os.path.basename(b) != folder(b) + ".h":
                findings.append(f"include of another folder's private header {a} -> {b}")
    cflags = ([f"-I{args.src}"] + [f"-I{os.path.join(args.src, f)}" for f in rank if f in dirs]
              + shlex.split(args.cflags or ""))
    inline = inline_edges(files, owner, shlex.split(args.cc), cflags) if args.cc else {}
    if any(v is None for v in inline.values()):
        findings.append("a header does not compile alone (above)")
    whole = {a: set(uses[a]) for a in uses}
    for src, dst in list(inc.items()) + [(h, set(v)) for h, v in inline.items() if v]:
        whole.setdefault(src, set()).update(dst)
    for part in circles(whole):
        if sum(1 for v in part if not v.endswith(".h")) >= 2:
            findings.append(f"a circle through headers: {' '.join(part)}")
            for a in part:
                for b in sorted(whole.get(a, set()) & set(part)):
                    why = inline.get(a, {}).get(b) if a.endswith(".h") else uses.get(a, {}).get(b)
                    print(f"  {a} -> {b}" + (f": {' '.join(sorted(why))}" if why else ""))
    by_file = file_edges(files, inc, uses)
    for part in circles(by_file):
        findings.append(f"a circle of files through their own headers: {' '.join(part)}")
        for a in part:
            for b in sorted(set(by_file[a]) & set(part)):
                print(f"  {a} -> {b}: {' '.join(sorted(set(by_file[a][b])))}")
    findings += unshared(files, needs, owner, rank, args.tests)
    for line in findings:
        print(f"check_layers: {line}")
    return findings


def main():
    p = argparse.ArgumentParser(usage=__doc__.splitlines()[0])
    p.add_argument("--order")
    p.add_argument("--src")
    p.add_argument("--cc")
    p.add_argument("--cflags")
    p.add_argument("--tests", action="append")
    p.add_argument("objdir")
    args = p.parse_args()
    if args.order and not args.src:
        sys.exit("check_layers: --order needs --src")
    needs, owner = objects_of(args.objdir, args.src)
    uses = edges(needs, owner)
    found = circles(uses)
    if found:
        for part in found:
            print(f"check_layers: a circle of {len(part)} files: {' '.join(part)}")
            for a in part:
                for b in sorted(set(uses[a]) & set(part)):
                    print(f"  {a} -> {b}: {' '.join(sorted(uses[a][b]))}")
        return 1
    if args.order and check_order(args, uses, owner, needs):
        return 1
    level = levels(uses)
    for n in range(max(level.values()) + 1):
        print(f"  level {n}: {' '.join(sorted(v for v in level if level[v] == n))}")
    print(f"check_layers: {len(uses)} files, no circle" +
          (f", every call and include down {args.order}" if args.order else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
