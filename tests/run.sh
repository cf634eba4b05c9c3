#!/usr/bin/env bash
#
# run.sh BUILD - runs the whole GPU-less suite against the build in BUILD
# (make test: build; make test-sanitize: build/sanitize) and ends with exactly
# one line, "tests: N passed, M failed". Exits non-zero if anything failed,
# any test program exited non-zero, or an expected program is missing.
#
#   - the Criterion programs BUILD/tests/test_{unit,e2e,process}, two jobs at
#     a time (the machine has two cores); their "Synthesis:" lines are summed;
#   - tests/check_exports.sh on BUILD/libipccache.so, counted as one check;
#   - tests/test_tools.sh, if present, whose "tools: N passed, M failed" line
#     is added in;
#   - a batch of the differential fuzzer (tests/fuzz.sh), counted as one
#     check: IPCC_FUZZ_SEEDS seeds (default 200; 0 skips it) from
#     IPCC_FUZZ_FIRST (default 1).

set -u

if [[ $# -ne 1 ]]; then
    echo "usage: tests/run.sh BUILD" >&2
    exit 2
fi
build=$1   # as the caller sees it, relative to the current folder
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

export IPCC_TEST_BUILD=$build
if [[ $build == *sanitize* ]]; then
    # Processes we preload into are not built with ASan: its runtime must be
    # loaded first. Their leaks are not ours to judge.
    IPCC_TEST_PRELOAD_PREFIX=$("${CC:-cc}" -print-file-name=libasan.so)
    export IPCC_TEST_PRELOAD_PREFIX
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
fi

passed=0 failed=0 status=0
log=$(mktemp "${TMPDIR:-/tmp}/ipccache-run.XXXXXX") || exit 2
trap 'rm -f "$log"' EXIT

# Adds the counts found by the extended regex $2 (two groups: passed,
# failed) in the last matching line of $log; a missing line is one failure.
add_counts() {
    local what=$1 regex=$2 line
    line=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E "$regex" | tail -n 1)
    if [[ $line =~ $regex ]]; then
        passed=$((passed + BASH_REMATCH[1]))
        failed=$((failed + BASH_REMATCH[2]))
    else
        echo "run.sh: $what printed no summary; counted as one failure"
        failed=$((failed + 1))
        status=1
    fi
}

# Criterion's "Failing" already includes the crashed tests.
run_criterion() {
    local bin=$build/tests/$1
    echo "== $bin"
    if [[ ! -x $bin ]]; then
        echo "run.sh: $bin is missing (not built?); counted as one failure"
        failed=$((failed + 1))
        status=1
        return
    fi
    "$bin" --jobs 2 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    [[ $rc -eq 0 ]] || { echo "run.sh: $bin exited with status $rc"; status=1; }
    add_counts "$bin" 'Synthesis: Tested: [0-9]+ \| Passing: ([0-9]+) \| Failing: ([0-9]+)'
}

# One check, pass or fail.
run_check_exports() {
    local lib=$build/libipccache.so map=$root/shim/ipccache.map
    echo "== check_exports"
    if [[ ! -f $lib || ! -f $map ]]; then
        echo "run.sh: $lib or $map missing; export check skipped"
        return
    fi
    if bash "$root/tests/check_exports.sh" "$lib" "$map"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        status=1
    fi
}

run_tools() {
    local tools=$root/tests/test_tools.sh
    [[ -f $tools ]] || return
    echo "== tests/test_tools.sh"
    bash "$tools" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    [[ $rc -eq 0 ]] || { echo "run.sh: tests/test_tools.sh exited with status $rc"; status=1; }
    add_counts tests/test_tools.sh 'tools: ([0-9]+) passed, ([0-9]+) failed'
}

# One check for the whole batch; only the first few failing seeds are
# minimised, so a broken build still finishes quickly.
run_fuzz() {
    local seeds=${IPCC_FUZZ_SEEDS:-200} first=${IPCC_FUZZ_FIRST:-1}
    [[ $seeds == 0 ]] && return
    echo "== tests/fuzz.sh ($seeds seeds from $first)"
    if FUZZ_MAX_MINIMIZE=${FUZZ_MAX_MINIMIZE:-3} \
        bash "$root/tests/fuzz.sh" "$build" --seeds "$seeds" --first "$first"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        status=1
    fi
}

for t in test_unit test_e2e test_process; do
    run_criterion "$t"
done
run_check_exports
run_tools
run_fuzz

echo "tests: $passed passed, $failed failed"
[[ $failed -eq 0 && $status -eq 0 ]]
