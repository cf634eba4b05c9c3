#!/usr/bin/env python3
"""Check an ipccache stats file against simple assertions.

usage: stats_check.py FILE EXPR [EXPR...]
  EXPR is KEY OP INT with OP one of == != >= <= > <, e.g. real_opens==1 hits>=49.

The library writes one JSON line per dump (SIGUSR1 or exit); the LAST line of
FILE is the one checked, so a file with an earlier SIGUSR1 dump still works.
Prints the line and every failed assertion; exits 0 when all hold, 1 when one
fails, 2 when the file is missing or unreadable.
"""
import json
import operator
import re
import sys

OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
EXPR_RE = re.compile(r"^([a-z_]+)(==|!=|>=|<=|>|<)(-?\d+)$")


def last_stats(path):
    """The last JSON object in the file, or None."""
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return None
    for line in reversed(lines):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def check(stats, exprs):
    """Returns the list of failure messages (empty when all hold)."""
    failures = []
    for expr in exprs:
        m = EXPR_RE.match(expr.replace(" ", ""))
        if not m:
            failures.append(f"bad expression {expr!r}")
            continue
        key, op, want = m.group(1), m.group(2), int(m.group(3))
        if key not in stats:
            failures.append(f"{key} missing")
        elif not OPS[op](stats[key], want):
            failures.append(f"{key}={stats[key]} but expected {op}{want}")
    return failures


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    stats = last_stats(argv[1])
    if stats is None:
        print(f"stats_check: no stats line in {argv[1]}")
        return 2
    print("stats: " + json.dumps(stats, sort_keys=True))
    failures = check(stats, argv[2:])
    for msg in failures:
        print(f"stats_check: {msg}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
