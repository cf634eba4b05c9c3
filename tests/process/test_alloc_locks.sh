#!/usr/bin/env bash
#
# test_alloc_locks.sh - an importer of another process's export (the release
# ledger records which process each handle came from) makes no allocator call
# while it holds a lock of ipccache's: an allocator whose fork handler was
# registered after the library's would hang a fork there (docs/limits.md,
# Other interposers). tests/process/alloc_lock_lib.c, preloaded ahead of the
# library, counts such calls; the exporter is a second process.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup alloc_locks
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
TAP_SHOW="$tmp/out"
export LD_LIBRARY_PATH=$build/tests

if [[ -n ${IPCC_TEST_PRELOAD_PREFIX:-} ]]; then
    skip "alloc_locks: a cross-process import records its exporter with no allocator call under a lock" \
        "the counting allocator cannot sit ahead of the sanitizer's"
    tap_summary alloc-locks
    exit
fi

coproc EXPORTER { LD_PRELOAD=$build/libipccache.so exec "$build/tests/ghost_peer" 2>/dev/null; }
# bash unsets EXPORTER and EXPORTER_PID once the coprocess has exited: copies.
exporter_pid=$EXPORTER_PID exporter_in=${EXPORTER[1]} exporter_out=${EXPORTER[0]}
echo "alloc 1048576" >&"$exporter_in"
read -r -t 10 line <&"$exporter_out"
handle=${line##* }
printf 'open %s\nclose 0\nexit\n' "$handle" |
    ALLOC_LOCK_REPORT=1 LD_PRELOAD=$build/tests/liballoclock.so:$build/libipccache.so \
    timeout 20 "$build/tests/ghost_peer" >"$tmp/out" 2>&1
check "alloc_locks: a cross-process import records its exporter with no allocator call under a lock" \
    bash -c '! grep -q "^alloc_lock:" "$1" && [ "$(grep -c "^ok 0" "$1")" = 2 ]' _ "$tmp/out"
echo exit 2>/dev/null >&"$exporter_in"
wait "$exporter_pid" 2>/dev/null

tap_summary alloc-locks
