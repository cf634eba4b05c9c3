#!/usr/bin/env bash
#
# test_standin_rl.sh - the RL weight sync's VMM calls (tools/bench/standin_rl.c,
# make bench-standin) against the stand-in driver: without the library every
# step reaches the driver; with it, once the first steps are cached, no step
# makes a real import, reserve, map, set-access or unmap. Counts only, no
# timing.

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

tap_summary standin-rl
