#!/usr/bin/env python3
"""Record and compare test outcomes for tools/peer_suites.sh.

Each test's outcome is appended to the file named by PEER_RECORD as soon as it
is known, one line "<test id>\\t<event>", flushed: a run killed half-way (a
hang, a crash) still leaves what it finished, and a test that started but
never reported shows as "no-result". Events: started, passed, failed, error,
skipped, xfailed, xpassed.

usage:
  pytest -p peer_record ...                 as a pytest plugin (tools/ on PYTHONPATH)
  peer_record.py unittest TARGET [WORD...]  run TARGET (a .py file or a module
                                            name) with unittest, only the tests
                                            whose id contains one of WORDs
  peer_record.py find MODULE...             print the first importable MODULE
  peer_record.py compare SUITE A B          outcome per test, A (without the
                                            preload) against B (with it)
  peer_record.py stats DIR                  sum the ipccache stats lines in DIR
"""
import glob
import importlib
import importlib.util
import json
import os
import sys
import unittest

# A test reported more than once (a call and then its teardown, subtests)
# keeps its worst outcome.
RANK = {"started": 0, "passed": 1, "skipped": 2, "xfailed": 3, "xpassed": 4,
        "failed": 5, "error": 6}


def emit(test_id, event):
    """Append one event to PEER_RECORD; silently nothing when it is unset."""
    path = os.environ.get("PEER_RECORD")
    if not path:
        return
    # Tabs and newlines in an id would break the line format.
    clean = " ".join(test_id.split())
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{clean}\t{event}\n")


# ------------------------------------------------------------ pytest plugin

# pytest's node ids name the file relative to where pytest ran; module names
# do not depend on that: "module::Class::test".
NAMES = {}


def pytest_itemcollected(item):
    module = getattr(getattr(item, "module", None), "__name__", None)
    if module:
        NAMES[item.nodeid] = "::".join([module] + item.nodeid.split("::")[1:])


def pytest_runtest_logstart(nodeid, location):
    emit(NAMES.get(nodeid, nodeid), "started")


def pytest_runtest_logreport(report):
    """A failing setup or teardown is an error, as pytest itself counts it."""
    name = NAMES.get(report.nodeid, report.nodeid)
    if hasattr(report, "wasxfail"):
        if report.skipped:
            emit(name, "xfailed")
        elif report.passed:
            emit(name, "xpassed")
        return
    if report.when == "call":
        emit(name, report.outcome)
    elif report.skipped:
        emit(name, "skipped")
    elif report.failed:
        emit(name, "error")


# ---------------------------------------------------------- unittest runner

class RecordingResult(unittest.TextTestResult):
    """unittest's verbose result that also records every outcome."""

    def startTest(self, test):
        super().startTest(test)
        emit(test.id(), "started")

    def addSuccess(self, test):
        super().addSuccess(test)
        emit(test.id(), "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        emit(test.id(), "failed")

    def addError(self, test, err):
        super().addError(test, err)
        emit(test.id(), "error")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        emit(test.id(), "skipped")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        emit(test.id(), "xfailed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        emit(test.id(), "xpassed")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            emit(test.id(), "failed" if failed else "error")


def import_target(target):
    """A path to a .py file is imported by its base name from its folder,
    so that spawned children can import it again by that name."""
    if target.endswith(".py"):
        folder, name = os.path.split(os.path.abspath(target))
        sys.path.insert(0, folder)
        target = name[:-3]
    return importlib.import_module(target)


def run_unittest(target, words):
    # The module may parse sys.argv when it is imported.
    sys.argv = [target]
    module = import_target(target)
    loader = unittest.TestLoader()
    if words:
        loader.testNamePatterns = [f"*{w}*" for w in words]
    suite = loader.loadTestsFromModule(module)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=RecordingResult)
    return 0 if runner.run(suite).wasSuccessful() else 1


# ----------------------------------------------------------------- finding

def find_module(names):
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                print(name)
                return 0
        except Exception:  # a parent package that fails to import
            continue
    return 1


# --------------------------------------------------------------- comparing

def load_outcomes(path):
    """{test id: outcome}; a test that only started is "no-result"."""
    outcomes = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                test_id, sep, event = line.rstrip("\n").rpartition("\t")
                if not sep or event not in RANK:
                    continue
                old = outcomes.get(test_id, "started")
                if RANK[event] >= RANK[old]:
                    outcomes[test_id] = event
    except FileNotFoundError:
        pass
    return {k: ("no-result" if v == "started" else v) for k, v in outcomes.items()}


def compare(suite, path_a, path_b):
    """Print one row per test and the summary line; 1 if any outcome differs
    or neither run reported a single test."""
    a, b = load_outcomes(path_a), load_outcomes(path_b)
    ids = sorted(set(a) | set(b))
    width = max([len(i) for i in ids] + [4])
    print(f"  {'test':<{width}}  {'without':<9}  {'with':<9}")
    differ = 0
    for test_id in ids:
        out_a, out_b = a.get(test_id, "missing"), b.get(test_id, "missing")
        mark = "" if out_a == out_b else "  DIFFERS"
        differ += out_a != out_b
        print(f"  {test_id:<{width}}  {out_a:<9}  {out_b:<9}{mark}")
    if not ids:
        print(f"peer: {suite}: no results from either run")
        return 1
    print(f"peer: {suite}: {len(ids) - differ} same, {differ} differ")
    return 1 if differ else 0


# ------------------------------------------------------------------- stats

def stats(folder):
    """One line: how many processes reported, and their summed counters."""
    keys = ("opens", "hits", "misses", "real_opens", "vmm_imports", "vmm_import_hits",
            "vmm_maps", "vmm_map_hits", "errors")
    totals = dict.fromkeys(keys, 0)
    procs = 0
    for path in sorted(glob.glob(os.path.join(folder, "*"))):
        last = None
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    last = json.loads(line)
                except ValueError:
                    continue
        if isinstance(last, dict):
            procs += 1
            for k in keys:
                totals[k] += int(last.get(k, 0))
    summary = ", ".join(f"{k} {v}" for k, v in totals.items())
    print(f"{procs} process(es) reported: {summary}")
    return 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "unittest":
        return run_unittest(argv[1], argv[2:])
    if len(argv) >= 2 and argv[0] == "find":
        return find_module(argv[1:])
    if len(argv) == 4 and argv[0] == "compare":
        return compare(*argv[1:])
    if len(argv) == 2 and argv[0] == "stats":
        return stats(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
