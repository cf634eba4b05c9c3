#!/usr/bin/env python3
"""check_tests.py FILE... - the Criterion tests are named and bounded.

For each tests/*/test_X.c given: it declares only the suite X (Test,
ParameterizedTest, Theory, TestSuite), every test has a .timeout of its own
or from its file's TestSuite, no two files declare the same suite, and no
suite/test name is used twice across all the files. Prints each finding and
exits 1 if there was one.
"""
import os
import re
import sys

DECL = re.compile(r"^(Test|ParameterizedTest|Theory|TestSuite)\s*\((.*?)\)\s*(?:\{|;|$)", re.M | re.S)


def args_of(kind, text):
    parts = [p.strip() for p in text.split(",")]
    if kind in ("ParameterizedTest", "Theory"):
        parts = parts[1:]  # the parameter comes first
    return parts


def check(paths):
    findings, seen, suites = [], {}, {}
    for path in paths:
        suite = os.path.basename(path)[len("test_"):-len(".c")]
        if suite in suites:
            findings.append(f"{path}: suite {suite} also declared by {suites[suite]}")
        suites.setdefault(suite, path)
        with open(path) as f:
            text = f.read()
        suite_timeout = False
        tests = []
        for m in DECL.finditer(text):
            kind, parts = m.group(1), args_of(m.group(1), " ".join(m.group(2).split()))
            line = text.count("\n", 0, m.start()) + 1
            if not parts or parts[0] != suite:
                findings.append(f"{path}:{line}: suite {parts[0] if parts else '?'}, not {suite}")
            timed = any(re.match(r"\.timeout\s*=", p) for p in parts)
            if kind == "TestSuite":
                suite_timeout = suite_timeout or timed
                continue
            name = f"{parts[0] if parts else '?'}/{parts[1] if len(parts) > 1 else '?'}"
            if name in seen:
                findings.append(f"{path}:{line}: {name} also at {seen[name]}")
            seen[name] = f"{path}:{line}"
            tests.append((line, name, timed))
        for line, name, timed in tests:
            if not timed and not suite_timeout:
                findings.append(f"{path}:{line}: {name} has no timeout (its own or its suite's)")
    return findings


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: check_tests.py FILE...")
    findings = check(sys.argv[1:])
    for f in findings:
        print(f"check_tests: {f}")
    if not findings:
        print(f"check_tests: {len(sys.argv) - 1} files, one suite each, every test timed")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
