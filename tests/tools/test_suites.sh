#!/usr/bin/env bash
#
# test_suites.sh - the Criterion tests are named and bounded:
# tests/tools/check_tests.py finds that each tests/*/test_X.c declares only
# the suite X, no suite in two files, no test name twice, and a timeout on
# every test (its own or its suite's). Also checks that the check sees each of
# those planted.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"
tap_setup suites
TAP_SHOW="$tmp/out"
check_tests() { python3 "$root/tests/tools/check_tests.py" "$@" >"$tmp/out" 2>&1; }

check_tests "$root"/tests/*/test_*.c
check "suites: one suite per file, every test timed, no name twice" test $? -eq 0
cat "$tmp/out"

mkdir -p "$tmp/a" "$tmp/b"
printf 'TestSuite(one, .timeout = 5);\nTest(one, x)\n{\n}\n' >"$tmp/a/test_one.c"
printf 'Test(two, y,\n     .timeout = 5)\n{\n}\nParameterizedTest(int *k, two, z, .timeout = 5)\n{\n}\n' \
    >"$tmp/a/test_two.c"
check_tests "$tmp/a/test_one.c" "$tmp/a/test_two.c"
check "suites: timed tests, by themselves or by their suite, pass" test $? -eq 0

printf 'Test(one, x, .timeout = 5)\n{\n}\nTest(other, y, .timeout = 5)\n{\n}\n' >"$tmp/b/test_one.c"
check_tests "$tmp/b/test_one.c"
check "suites: a file declaring another file's suite fails" grep -q 'suite other, not one' "$tmp/out"

printf 'Test(one, x, .timeout = 5)\n{\n}\nTest(one, y)\n{\n}\n' >"$tmp/b/test_one.c"
check_tests "$tmp/b/test_one.c"
check "suites: a test without a timeout fails" grep -q 'one/y has no timeout' "$tmp/out"

mkdir -p "$tmp/b/again"
printf 'Test(one, x, .timeout = 5)\n{\n}\n' >"$tmp/b/test_one.c"
cp "$tmp/b/test_one.c" "$tmp/b/again/test_one.c"
check_tests "$tmp/b/test_one.c" "$tmp/b/again/test_one.c"
check "suites: a test name used twice fails" grep -q 'one/x also at' "$tmp/out"

printf 'Test(one, y, .timeout = 5)\n{\n}\n' >"$tmp/b/again/test_one.c"
check_tests "$tmp/b/test_one.c" "$tmp/b/again/test_one.c"
check "suites: two files declaring the same suite fail" \
    grep -q 'suite one also declared by .*/b/test_one.c' "$tmp/out"

tap_summary suites
