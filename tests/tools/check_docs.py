#!/usr/bin/env python3
"""check_docs.py CHECK - one check of the documents' layout for test_docs.sh;
prints one line per problem (none: the check passes).

  links     every relative link of the Markdown documents names a file that
            exists, and an anchor a heading of that file makes
  paths     every `path` of the repository they name in code spans exists
  once      each name on stdin (settings, stats keys) has one table row that
            names it in its first cell, in the README
  limits    each section of docs/limits.md is one line of the README's list
  length    the README: at most 250 lines; no line but a table row over 120
"""

import re
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


def main(argv):
    checks = {"links": check_links, "paths": check_paths, "limits": check_limits,
              "length": check_length,
              "once": lambda: check_once(sys.stdin.read().split())}
    if len(argv) != 1 or argv[0] not in checks:
        print(__doc__, file=sys.stderr)
        return 2
    checks[argv[0]]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
