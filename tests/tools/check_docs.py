#!/usr/bin/env python3
"""check_docs.py CHECK - one check of the documents' layout for test_docs.sh;
prints one line per problem (none: the check passes).

  links     every relative link of the Markdown documents names a file that
            exists, and an anchor a heading of that file makes
  paths     every `path` of the repository they name in code spans exists
  once      each name on stdin (settings, stats keys) has one table row that
            names it in its first cell, in the README
  limits    each section of docs/limits.md is one line of the README's list
  results   every results/ path the README and docs/performance.md name
            (in code, a link or plain text) exists
  length    the README: at most 250 lines; no line but a table row over 120
  layers    docs/design.md's layer table lists shim/layers.txt's folders,
            in its order (peers in one row)
  comments  every file a comment of shim/, tests/, tools/ or the Makefile names
            is a tracked file (or an outside one on EXTERNAL), and every
            README "X" or <doc>.md "X" it cites is a heading of that document;
            every ipcc_X / IPCC_X a comment of shim/ names is a name of shim/'s
            code (ipcc_X_* or ipcc_X_: one that starts so)
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "results" / "README.md", ROOT / "examples" / "README.md"] + \
    sorted((ROOT / "docs").glob("*.md"))
MAX_LINES, MAX_WIDTH = 250, 120


def text_of(path):
    """The document without its fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def slug(heading):
    """The anchor GitHub gives a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    return {slug(line.lstrip("#")) for line in text_of(path) if line.startswith("#")}


def check_links():
    for doc in DOCS:
        for line in text_of(doc):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                name, _, anchor = target.partition("#")
                dest = (doc.parent / name).resolve() if name else doc
                where = "%s: (%s)" % (doc.relative_to(ROOT), target)
                if not dest.exists():
                    print(where + ": no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    print(where + ": no such heading")


PATH_SPAN = re.compile(r"`((?:shim|tests|tools|docs|examples|python|results)/[^`\s]*)`")


def check_paths():
    for doc in DOCS:
        for line in text_of(doc):
            for path in PATH_SPAN.findall(line):
                if re.search(r"[<*%{]", path):
                    continue
                base = doc.parent if doc.parent.name == "results" and \
                    not path.startswith("results/") else ROOT
                if not (base / path).exists() and not (ROOT / path).exists():
                    print("%s: `%s` does not exist" % (doc.relative_to(ROOT), path))


RESULTS_PATH = re.compile(r"(?<![\w/.-])(?:\.\./)?(results/[^\s`()\[\]|,;\"']*)")


def check_results():
    for doc in (ROOT / "README.md", ROOT / "docs" / "performance.md"):
        if not doc.exists():
            continue
        for line in text_of(doc):
            for path in RESULTS_PATH.findall(line):
                path = path.rstrip(".:")
                if re.search(r"[<*%{]", path):
                    continue
                if not (ROOT / path).exists():
                    print("%s: %s does not exist" % (doc.relative_to(ROOT), path))


def check_once(names):
    for name in names:
        rows = [(doc.relative_to(ROOT), line) for doc in DOCS for line in text_of(doc)
                if line.startswith("| ") and "`%s`" % name in line.split(" | ")[0]]
        if len(rows) != 1 or str(rows[0][0]) != "README.md":
            print("%s: %d table rows (%s); want one, in README.md"
                  % (name, len(rows), ", ".join(sorted({str(d) for d, _ in rows}))))


def check_limits():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for line in text_of(ROOT / "docs" / "limits.md"):
        if line.startswith("## ") and line != "## Troubleshooting":
            link = "](docs/limits.md#%s)" % slug(line[3:])
            count = len([l for l in readme.splitlines() if l.startswith("- ") and link in l])
            if count != 1:
                print("%s: linked by %d lines of the README's list; want 1" % (line, count))


def check_length():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    if len(lines) > MAX_LINES:
        print("README.md: %d lines, more than %d" % (len(lines), MAX_LINES))
    for n, line in enumerate(lines, 1):
        if len(line) > MAX_WIDTH and not line.startswith("|"):
            print("README.md:%d: %d characters" % (n, len(line)))


# Files a comment may name that are not the repository's: CUDA's header, the
# peer suites' own tests, the mutant tool's scratch names.
EXTERNAL = {"cuda.h", "mutant.py", "log.txt", "test_cuda_ipc_transport.py",
            "test/test_multiprocessing.py", "test/registered/unit/multimodal/test_cuda_ipc_transport.py"}
FILE_NAME = re.compile(r"(?<![\w./$-])([\w./-]*\w\.(?:c|h|S|cu|sh|py|md|def|map|txt))\b")
CITE = re.compile(r"\b(README|[\w/-]+\.md),? \"([^\"]+)\"")
IDENT = re.compile(r"\b((?:ipcc|IPCC)_\w*)(\*?)")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def comments_of(path, text):
    """(line, comment) of a C file's /* */ and //, of others' "# ..." lines."""
    if path.endswith((".c", ".h", ".S", ".cu")):
        for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S):
            yield text.count("\n", 0, m.start()) + 1, m.group(0)
        return
    for n, line in enumerate(text.splitlines(), 1):
        m = re.search(r"(?:^|\s)#(?:\s.*|$)", line)
        if m:
            yield n, m.group(0)


def heading_doc(name):
    if name == "README":
        return ROOT / "README.md"
    hits = [d for d in DOCS if str(d.relative_to(ROOT)) == name or d.name == name]
    return hits[0] if hits else None


def check_layers():
    order = []
    for line in (ROOT / "shim" / "layers.txt").read_text(encoding="utf-8").splitlines():
        words = line.split("#", 1)[0].split()
        if words and words[0] != "allow":
            order.append(words)
    rows, inside = [], False
    for line in text_of(ROOT / "docs" / "design.md"):
        if line.startswith("## "):
            inside = line == "## Layers, top to bottom"
        elif inside and line.startswith("| `shim/"):
            rows.append(re.findall(r"`shim/(\w+)/`", line.split(" | ")[0]))
    if rows != order:
        print("docs/design.md's layer table: %s; shim/layers.txt: %s"
              % (" / ".join(" ".join(r) for r in rows), " / ".join(" ".join(o) for o in order)))


def check_comments():
    git = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if git.returncode == 0:
        tracked = git.stdout.split()
    else:  # a copy of the tree without its history: every file but the build's
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                   and p.relative_to(ROOT).parts[0] not in ("build", ".git")]
    # A path's tail names it too (the files of shim/ go without "shim/").
    names = {"/".join(f.split("/")[i:]) for f in tracked for i in range(f.count("/") + 1)}
    names |= EXTERNAL
    # The library's own names, from its code with the comments taken out.
    code = set()
    for f in tracked:
        if f.startswith("shim/") and f.endswith((".c", ".h", ".S", ".def", ".in")):
            code |= {m.group(1) for m in IDENT.finditer(COMMENT.sub(" ", (ROOT / f).read_text(
                encoding="utf-8", errors="replace")))}
    for f in tracked:
        if not re.match(r"(shim|tests|tools)/|Makefile$", f) or f.startswith("tools/bench/"):
            continue
        path = ROOT / f
        if not f.endswith((".c", ".h", ".S", ".cu", ".sh", ".py", ".def", ".in")) and f != "Makefile":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for n, comment in comments_of(f, text):
            for name in FILE_NAME.findall(comment):
                if name not in names and "_X." not in name and not name.startswith("/"):
                    print("%s:%d: names %s, which is no file" % (f, n, name))
            for doc, heading in CITE.findall(" ".join(comment.split())):
                dest = heading_doc(doc)
                if dest is None or slug(heading) not in anchors(dest):
                    print('%s:%d: cites %s "%s", which is no heading' % (f, n, doc, heading))
            for name, glob in IDENT.findall(comment) if f.startswith("shim/") else ():
                if not (name in code or (glob or name.endswith("_"))
                        and any(c.startswith(name) for c in code)):
                    print("%s:%d: names %s%s, which the code does not" % (f, n, name, glob))


def main(argv):
    checks = {"links": check_links, "paths": check_paths, "limits": check_limits,
              "length": check_length, "results": check_results, "comments": check_comments,
              "layers": check_layers,
              "once": lambda: check_once(sys.stdin.read().split())}
    if len(argv) != 1 or argv[0] not in checks:
        print(__doc__, file=sys.stderr)
        return 2
    checks[argv[0]]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
