#!/usr/bin/env bash
#
# test_standin_rl.sh - the RL weight sync's VMM calls (tools/bench/standin_rl.c,
# make bench-standin) against the stand-in driver: without the library every
# step reaches the driver; with it, once the first steps are cached, no step
# makes a real import, reserve, map, set-access or unmap. Then every shape of
# issue 17, once warm: the in-order ones (one tensor at a time, 512 MiB
# buckets, two engines in turn) make at most 5% of their maps and
# set-access calls real; orders that change every step (reversed every other
# step, shuffled) never make more real calls than without the library, the
# reversed one hits 95% of its maps (its two ways are two orders, each
# predicted) and the shuffled one reuses its ranges. Counts only, no timing.
# Last, make bench-standin's report (tools/bench/standin_report.sh, a few steps):
# its labels, and its last line the result.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup standin_rl
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
prog=$build/tools/standin_rl
lib=$build/libipccache.so
TAP_SHOW="$tmp/out"
# The sanitizer run: the ASan runtime must be loaded before the library.
preload="${IPCC_TEST_PRELOAD_PREFIX:+$IPCC_TEST_PRELOAD_PREFIX }$lib"

if [[ ! -x $prog ]]; then
    not_ok "standin_rl: $prog is built"
    tap_summary standin-rl
    exit
fi

real() { grep -o 'real_per_step: .*' "$tmp/out"; }

"$prog" 22 20 >"$tmp/out" 2>&1
check "standin_rl: without the library every step reaches the driver" \
    grep -q 'chunks_per_step=201 .*real_per_step: imports=201.0 reserves=90.0 maps=201.0 set_access=90.0 unmaps=201.0' "$tmp/out"

LD_PRELOAD=$preload "$prog" 22 20 >"$tmp/out" 2>&1
check "standin_rl: with it the same rebuilds, and no step after the first makes a real call" \
    grep -q 'chunks_per_step=201 .*real_per_step: imports=0.0 reserves=0.0 maps=0.0 set_access=0.0 unmaps=0.0' "$tmp/out"

# Its VMM tables grow and shrink under the table lock, which the fork handlers take: the
# allocator ahead of the library (tests/process/alloc_lock_lib.c) counts its calls made
# under a lock of ipccache's, and there must be none (docs/limits.md, Other interposers).
if [[ -z ${IPCC_TEST_PRELOAD_PREFIX:-} ]]; then
    ALLOC_LOCK_REPORT=1 LD_PRELOAD=$build/tests/liballoclock.so:$lib "$prog" 22 20 >"$tmp/out" 2>&1
    check "standin_rl: no allocator call under a lock of ipccache's" \
        bash -c '! grep -q "^alloc_lock:" "$1" && grep -q "imports=0.0" "$1"' _ "$tmp/out"
fi

# field NAME FILE: the value printed as NAME=value.
field() { grep -o "$1=[0-9.]*" "$2" | head -1 | cut -d= -f2; }
# at_most A B: A <= B (decimals).
at_most() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# play SHAPE: without the library into $tmp/SHAPE.without, with it into $tmp/SHAPE.with.
play() {
    "$prog" 22 12 "$1" >"$tmp/$1.without" 2>&1
    LD_PRELOAD=$preload "$prog" 22 12 "$1" >"$tmp/$1.with" 2>&1
    cat "$tmp/$1.without" "$tmp/$1.with" >"$tmp/out"
}

# in_order SHAPE: no real import or reserve once warm, at most 5% real maps and set-access calls.
in_order() {
    local with=$tmp/$1.with chunks rebuilds
    chunks=$(field chunks_per_step "$with")
    rebuilds=$(field rebuilds_per_step "$with")
    [[ -n $chunks && -n $rebuilds ]] &&
        at_most "$(field imports "$with")" 0 && at_most "$(field reserves "$with")" 0 &&
        at_most "$(field maps "$with")" "$(awk -v n="$chunks" 'BEGIN { print n * 0.05 }')" &&
        at_most "$(field set_access "$with")" "$(awk -v n="$rebuilds" 'BEGIN { print n * 0.05 }')"
}

# no_worse SHAPE: every real call count with the library at most the one without.
no_worse() {
    local f
    for f in imports reserves maps set_access unmaps frees; do
        at_most "$(field "$f" "$tmp/$1.with")" "$(field "$f" "$tmp/$1.without")" || return 1
    done
}

for shape in one buckets two; do
    play "$shape"
    check "standin_rl: $shape: once warm at most 5% of maps and set-access calls real, none of imports and reserves" \
        in_order "$shape"
done
for shape in reversed shuffled; do
    play "$shape"
    check "standin_rl: $shape: no real call count above the one without the library" no_worse "$shape"
done
check "standin_rl: reversed every other step: at least 95% of the maps hit once both ways are seen" \
    awk -F'map_hits=' '{ split($2, v, "%"); exit !(v[1] >= 95) }' "$tmp/reversed.with"
check "standin_rl: shuffled: ranges reused, at most 3% of rebuilds reserve anew" \
    at_most "$(field reserves "$tmp/shuffled.with")" "$(awk -v n="$(field rebuilds_per_step "$tmp/shuffled.with")" 'BEGIN { print n * 0.03 }')"

# The report: every part labelled, 16 lines, the last one its result (times not checked).
BENCH_STANDIN_STEPS=3 BENCH_STANDIN_PAIRS=1000 bash "$root/tools/bench/standin_report.sh" "$build" "$preload" \
    >"$tmp/out" 2>&1
report_ok() {
    local label
    for label in "bench-standin: the stand-in driver plays the GPU" "bench-standin: weight sync, all at once" \
        "  without  step median" "  with     step median" "bench-standin: the other shapes" \
        "  one       step median" "  reversed  step median" "  shuffled  step median" "  buckets   step median" \
        "  two       step median" "bench-standin: the legacy hit pair with ipccache" "  threads " "  same " \
        "  different " "  driver opens while timed: 0"; do
        grep -q "^$label" "$tmp/out" || return 1
    done
    local result='^bench-standin: result: a weight sync step of 201 chunks: 201 real maps and [0-9.]+ ms'
    result+=' without ipccache, 0 and [0-9.]+ ms with it \([0-9]+x faster here\)$'
    [[ $(wc -l <"$tmp/out") == 16 ]] && tail -n 1 "$tmp/out" | grep -qE "$result"
}
check "standin_rl: make bench-standin's report has its labels and ends in its result line" report_ok

tap_summary standin-rl
