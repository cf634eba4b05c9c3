#!/usr/bin/env bash
#
# test_tsan.sh - the legacy hit path raced: tests/process/race_threads.c at
# full speed, then built with the library and the stand-in driver under
# -fsanitize=thread (in BUILD/tsan, kept between runs). A data race, a
# failed call or a wrong reference count fails the case. The ThreadSanitizer
# cases are skipped where the compiler has no ThreadSanitizer runtime.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup tsan
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
tsan=$build/tsan
TAP_SHOW="$tmp/out"

# First at full speed, unsanitized: more interleavings of owners' calls on
# their loans with recalls in a second than ThreadSanitizer's pace gives.
if make --no-print-directory -C "$root" BUILD="$build" "$build/tests/race_threads" >"$tmp/out" 2>&1; then
    fast() {
        local i
        for i in 1 2 3 4 5; do
            "$build/tests/race_threads" "$@" >"$tmp/out" 2>&1 || return 1
        done
    }
    check "race: 8 threads hitting their loans and each other's entries, 5 runs: every reference counted" \
        fast
    check "race: the same under an idle cap of 2 (evictions, recalls), 5 runs: none over the cap" \
        fast 2
else
    not_ok "race: the race check builds"
    sed 's/^/#   /' "$tmp/out" | tail -n 20
fi

if ! echo 'int main(void) { return 0; }' | "${CC:-cc}" -fsanitize=thread -x c -o "$tmp/probe" - 2>/dev/null ||
    ! "$tmp/probe"; then
    skip "tsan: the hit path has no data race" "no ThreadSanitizer runtime here"
    tap_summary tsan
    exit
fi

if ! make --no-print-directory -C "$root" BUILD="$tsan" SANITIZE=-fsanitize=thread \
    "$tsan/tests/race_threads" >"$tmp/out" 2>&1; then
    not_ok "tsan: the race check builds"
    sed 's/^/#   /' "$tmp/out" | tail -n 20
    tap_summary tsan
    exit
fi

race() {
    TSAN_OPTIONS="halt_on_error=1 exitcode=66" "$tsan/tests/race_threads" "$@" >"$tmp/out" 2>&1
}
check "tsan: 8 threads hitting their loans and each other's entries: no data race, every reference counted" \
    race
check "tsan: the same under an idle cap of 2 (evictions, recalls): no data race, none over the cap" \
    race 2

tap_summary tsan
