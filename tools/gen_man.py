#!/usr/bin/env python3
"""gen_man.py [--check] - writes the generated parts of tools/ipccache.7 from
their one source each, so that the man page never holds a second copy:

  settings    build/ipccache-config --list (shim/base/config.c's table)
  stats keys  the README's "| Key | Meaning |" table
  limits      the README's "Will it fit my program" list

Each part sits between the lines '.\\" BEGIN generated NAME' and
'.\\" END generated NAME'. --check rewrites nothing and exits 1 (saying which
part) when the page is not what this would write.
"""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "tools" / "ipccache.7"
README = ROOT / "README.md"
CONFIG_TOOL = ROOT / "build" / "ipccache-config"


def inline(text):
    """Markdown inline text as roff: code bold, links as their text."""
    text = text.replace("\\", "\\e")
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.replace("**", "")
    text = re.sub(r"`([^`]*)`", lambda m: "\\fB" + m.group(1).replace("-", "\\-") + "\\fR", text)
    return text


def filled(text):
    """Wrapped source lines; none may start with a roff control character."""
    lines = textwrap.wrap(text, 78, break_on_hyphens=False, break_long_words=False)
    return ["\\&" + line if line[:1] in ".'" else line for line in lines]


def settings_part():
    listing = subprocess.run([str(CONFIG_TOOL), "--list"], check=True, capture_output=True,
                             text=True).stdout
    out = []
    for row in listing.splitlines():
        name, default, meaning = row.split("\t")
        out += [".TP", ".B \\%" + name]
        out += filled(inline(meaning) + " Default: " + (default if default == "unset"
                                                        else "\\fB" + default + "\\fR") + ".")
    return out


def readme_lines():
    return README.read_text(encoding="utf-8").splitlines()


def stats_part():
    lines = readme_lines()
    start = lines.index("| Key | Meaning |")
    out = []
    for row in lines[start + 2:]:
        if not row.startswith("|"):
            break
        keys, meaning = [cell.strip() for cell in row.strip("|").split(" | ", 1)]
        names = re.findall(r"`([^`]*)`", keys)
        if len(names) == 1:
            out += [".TP", ".B " + names[0]]
        else:
            out += [".TP", ".BR " + ' ", " '.join(names)]
        out += filled(inline(meaning))
    return out


def limits_part():
    lines = readme_lines()
    start = lines.index("## Will it fit my program")
    out = []
    for row in lines[start + 1:]:
        if row.startswith("## "):
            break
        if row.startswith("- "):
            text = re.sub(r"\s*\(\[more\]\([^)]*\)\)", "", row[2:])
            out += [".IP \\(bu 2"] + filled(inline(text))
    return out


PARTS = {"settings": settings_part, "stats": stats_part, "limits": limits_part}


def rewrite(page):
    for name, make in PARTS.items():
        begin, end = '.\\" BEGIN generated %s' % name, '.\\" END generated %s' % name
        if begin not in page or end not in page:
            raise SystemExit("gen_man.py: %s has no generated part %r" % (PAGE, name))
        head, rest = page.split(begin + "\n", 1)
        _, tail = rest.split(end + "\n", 1)
        page = head + begin + "\n" + "\n".join(make()) + "\n" + end + "\n" + tail
    return page


def main(argv):
    page = PAGE.read_text(encoding="utf-8")
    want = rewrite(page)
    if argv == ["--check"]:
        if want != page:
            print("gen_man.py: tools/ipccache.7 differs from its sources; run tools/gen_man.py",
                  file=sys.stderr)
            return 1
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    PAGE.write_text(want, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
