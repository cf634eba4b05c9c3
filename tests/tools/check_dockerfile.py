#!/usr/bin/env python3
"""check_dockerfile.py FILE... - the Dockerfile grammar checks that need no
docker: continuation lines joined, comments dropped, every instruction known,
only ARG before the first FROM, JSON forms valid, ENV and ARG well formed,
COPY/ADD with a source and a destination. Prints one line per problem and
exits 1 if there was any."""

import json
import re
import shlex
import sys

INSTRUCTIONS = {"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM",
                "HEALTHCHECK", "LABEL", "MAINTAINER", "ONBUILD", "RUN", "SHELL",
                "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}
JSON_FORM = {"ADD", "CMD", "COPY", "ENTRYPOINT", "RUN", "SHELL", "VOLUME"}
NAME = r"[A-Za-z_][A-Za-z0-9_]*"


def instructions(text):
    """(line number, keyword, arguments) per instruction."""
    start, parts = None, []
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*#", line) or (not line.strip() and not parts):
            continue
        if start is None:
            start = number
        continued = line.endswith("\\")
        parts.append(line[:-1] if continued else line)
        if not continued:
            keyword, _, args = " ".join(parts).strip().partition(" ")
            yield start, keyword.upper(), args.strip()
            start, parts = None, []
    if parts:
        yield start, "<EOF>", "a continuation line ends the file"


def problems(text):
    seen_from = False
    for number, keyword, args in instructions(text):
        where = "line %d: %s" % (number, keyword)
        if keyword not in INSTRUCTIONS:
            yield "%s: unknown instruction" % where
            continue
        if not seen_from and keyword not in ("ARG", "FROM"):
            yield "%s: only ARG may come before FROM" % where
        seen_from = seen_from or keyword == "FROM"
        if not args:
            yield "%s: no arguments" % where
            continue
        if keyword in JSON_FORM and args.startswith("["):
            try:
                value = json.loads(args)
            except ValueError as e:
                yield "%s: bad JSON form: %s" % (where, e)
                continue
            if not all(isinstance(v, str) for v in value):
                yield "%s: JSON form must be strings" % where
            continue
        try:
            words = shlex.split(args)
        except ValueError as e:
            yield "%s: bad quoting: %s" % (where, e)
            continue
        if keyword == "ENV" and "=" in words[0]:
            bad = [w for w in words if not re.match(NAME + "=", w)]
        elif keyword == "ENV":
            bad = [] if len(words) >= 2 and re.fullmatch(NAME, words[0]) else words[:1]
        elif keyword == "ARG":
            bad = [] if len(words) == 1 and re.match(NAME + "(=|$)", words[0]) else words
        elif keyword in ("COPY", "ADD"):
            bad = [] if len([w for w in words if not w.startswith("--")]) >= 2 else words
        else:
            bad = []
        if bad:
            yield "%s: malformed: %s" % (where, " ".join(bad))
    if not seen_from:
        yield "no FROM instruction"


def main(paths):
    status = 0
    for path in paths:
        with open(path) as f:
            for problem in problems(f.read()):
                print("%s: %s" % (path, problem))
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
