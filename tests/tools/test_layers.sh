#!/usr/bin/env bash
#
# test_layers.sh - every call between the library's files goes one way:
# tests/tools/check_layers.py reads the built objects' symbols (nm) and fails on
# any circle (docs/design.md says which layer registers what with which).
# Also checks that the check itself sees a circle planted in two objects.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"
tap_setup layers
build=${IPCC_TEST_BUILD:-build}
[[ $build == /* ]] || build=$root/$build
TAP_SHOW="$tmp/out"
check_layers() { python3 "$root/tests/tools/check_layers.py" "$1" >"$tmp/out" 2>&1; }

if [[ -d $build/shim ]]; then
    check_layers "$build/shim"
    check "layers: no circle among the library's files" test $? -eq 0
    cat "$tmp/out"
else
    not_ok "layers: $build/shim is built"
fi

# Two files that call each other, then the same two calling one way.
mkdir -p "$tmp/circle/low" "$tmp/oneway"
printf 'void high(void);\nvoid low(void) { high(); }\n' >"$tmp/low.c"
printf 'void low(void);\nvoid high(void) { low(); }\n' >"$tmp/high.c"
printf 'void low(void) { }\n' >"$tmp/low_alone.c"
"${CC:-cc}" -c -o "$tmp/circle/low/low.o" "$tmp/low.c" &&
    "${CC:-cc}" -c -o "$tmp/circle/high.o" "$tmp/high.c" &&
    "${CC:-cc}" -c -o "$tmp/oneway/low.o" "$tmp/low_alone.c" &&
    cp "$tmp/circle/high.o" "$tmp/oneway/high.o"
check "layers: the planted objects build" test $? -eq 0
check_layers "$tmp/circle"
check "layers: a circle of two files fails the check" test $? -eq 1
check "layers: the failure names both files and the symbols" \
    grep -qx '  low/low -> high: high' "$tmp/out"
check_layers "$tmp/oneway"
check "layers: the same files calling one way pass" test $? -eq 0

tap_summary layers
