#!/usr/bin/env bash
#
# run.sh BUILD - runs the whole GPU-less suite against the build in BUILD
# (make test: build; make test-sanitize: build/sanitize) and ends with exactly
# one line, "tests: N passed, M failed, K skipped". Exits non-zero if anything
# failed, any test program exited non-zero, or an expected program is missing.
#
#   - the Criterion programs BUILD/tests/test_{unit,e2e,process,ghost}, two jobs at
#     a time (the machine has two cores), each stopped after
#     IPCC_TEST_PROGRAM_TIMEOUT seconds (default 1800); their "Synthesis:" lines
#     are summed, and the tests they list but did not run are the skipped ones;
#   - tests/tools/check_exports.sh on BUILD/libipccache.so, counted as one check;
#   - every other tests/*/test_*.sh and tests/test_*.sh (tools, config tool, docs, examples,
#     install, wheel, peer-suite runner, layers; not test_aarch64.sh), each ending with a "WORD: N
#     passed, M failed[, K skipped]" line that is added in;
#   - no line of the library's ("ipccache: ...") in all that output, one
#     check: a test that expects a message captures it.
#   - a batch of the differential fuzzer (tests/fuzz/fuzz.sh), counted as one
#     check: IPCC_FUZZ_SEEDS seeds (default 200; 0 skips it) from
#     IPCC_FUZZ_FIRST (default 1); then the same seeds at a soft limit of 96
#     open files, where some pass the cache's bound on kept fds (12), one more.

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

# The run's own folder for temporary files (TMPDIR, which other users may
# cross: a tool test runs a process as another user) and for the library's
# per-user folder (XDG_RUNTIME_DIR, 0700): the run leaves nothing in /tmp and
# sees no other run's processes or files.
private=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-tests.XXXXXX") || exit 2
trap 'rm -rf "$private"' EXIT
chmod 711 "$private"
mkdir -m 700 "$private/run"
export TMPDIR=$private XDG_RUNTIME_DIR=$private/run

passed=0 failed=0 skipped=0 status=0
log=$private/log
all=$private/all

# Adds the counts found by the extended regex $2 (groups: passed, failed,
# and optionally a third that holds skipped) in the last matching line of
# $log; a missing line is one failure.
add_counts() {
    local what=$1 regex=$2 line
    cat "$log" >>"$all"
    line=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E "$regex" | tail -n 1)
    if [[ $line =~ $regex ]]; then
        passed=$((passed + BASH_REMATCH[1]))
        failed=$((failed + BASH_REMATCH[2]))
        [[ ${BASH_REMATCH[3]:-} =~ ([0-9]+) ]] && skipped=$((skipped + BASH_REMATCH[1]))
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
    # Criterion 2.4 with two jobs can miss a test's timeout (a longer one
    # started first keeps the shorter from firing): a bound on the program.
    local bound=${IPCC_TEST_PROGRAM_TIMEOUT:-1800}
    timeout -k 10 "$bound" "$bin" --jobs 2 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "run.sh: $bin ran past $bound s (a test hung); stopped"
        status=1
    elif [[ $rc -ne 0 ]]; then
        echo "run.sh: $bin exited with status $rc"
        status=1
    fi
    add_counts "$bin" 'Synthesis: Tested: [0-9]+ \| Passing: ([0-9]+) \| Failing: ([0-9]+)'
    count_criterion_skips "$bin"
}

# Criterion leaves skipped tests out of "Tested": they are the listed ones
# ("suite: N tests") it did not count.
count_criterion_skips() {
    local listed tested
    listed=$("$1" --list 2>/dev/null | sed -nE 's/^[^ ].*: ([0-9]+) tests?$/\1/p' |
        awk '{ n += $1 } END { print n + 0 }')
    tested=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | sed -nE 's/.*Synthesis: Tested: ([0-9]+).*/\1/p' |
        tail -n 1)
    if [[ -n $tested ]] && (( listed > tested )); then
        echo "run.sh: $1: $((listed - tested)) of $listed tests skipped"
        skipped=$((skipped + listed - tested))
    fi
}

# One check, pass or fail.
run_check_exports() {
    local lib=$build/libipccache.so map=$build/ipccache.map
    echo "== check_exports"
    if [[ ! -f $lib || ! -f $map ]]; then
        echo "run.sh: $lib or $map missing; export check skipped"
        return
    fi
    if bash "$root/tests/tools/check_exports.sh" "$lib" "$map" "$root/shim/entry/hooks.c"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        status=1
    fi
}

# A shell suite: its last "WORD: N passed, M failed[, K skipped]" line, or
# TAP's "# skipped: K" comment before a line without skips. Its passing
# "ok" lines go to the log only ($build/test.log keeps the whole run).
run_script() {
    local script=$1 line
    echo "== ${script#"$root"/}"
    bash "$script" >"$log" 2>&1
    local rc=$?
    awk '!/^ok - / || / # SKIP /' "$log"
    [[ $rc -eq 0 ]] || { echo "run.sh: $script exited with status $rc"; status=1; }
    add_counts "$script" '^[a-z-]+: ([0-9]+) passed, ([0-9]+) failed(, [0-9]+ skipped)?$'
    if ! grep -qE '^[a-z-]+: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log"; then
        line=$(grep -E '^# skipped: [0-9]+$' "$log" | tail -n 1)
        [[ -z $line ]] || skipped=$((skipped + ${line#\# skipped: }))
    fi
}

# One check for the whole batch; only the first few failing seeds are
# minimised, so a broken build still finishes quickly.
run_fuzz() {
    local seeds=${IPCC_FUZZ_SEEDS:-200} first=${IPCC_FUZZ_FIRST:-1}
    [[ $seeds == 0 ]] && return
    echo "== tests/fuzz/fuzz.sh ($seeds seeds from $first${1:+, $*})"
    if FUZZ_MAX_MINIMIZE=${FUZZ_MAX_MINIMIZE:-3} \
        bash "$root/tests/fuzz/fuzz.sh" "$build" --seeds "$seeds" --first "$first" "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        status=1
    fi
}

for t in test_unit test_e2e test_process test_ghost; do
    run_criterion "$t"
done
run_check_exports
for script in "$root"/tests/*/test_*.sh "$root"/tests/test_*.sh; do
    [[ $script == */test_aarch64.sh ]] || run_script "$script"
done
run_fuzz
run_fuzz --nofile 96

# A message from the library that reached the output is noise (or a bug): a
# test that expects one captures it and asserts on it.
check_quiet() {
    echo "== no stray library messages"
    if grep -E '^ipccache: ' "$all"; then
        echo "run.sh: the lines above reached the output; counted as one failure"
        failed=$((failed + 1))
    else
        passed=$((passed + 1))
    fi
}
check_quiet

cp "$all" "$build/test.log" 2>/dev/null && echo "(every check's line: $build/test.log)"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $status -eq 0 ]]
