#!/usr/bin/env bash
#
# one.sh WHAT [BUILD] - runs one test or one suite of make test's, alone:
#   tests/one.sh vmm                      every test of the Criterion suite vmm
#   tests/one.sh vmm/kept_chunk_is_a_hit  that one test
#   tests/one.sh layers                   the shell suite tests/tools/test_layers.sh
# A Criterion suite is looked for in each of BUILD/tests/test_{unit,e2e,
# process,ghost} (BUILD: build; make test-programs builds them).

set -u
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: tests/one.sh SUITE[/TEST] [BUILD]" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
what=$1 build=${2:-$root/build}
export IPCC_TEST_BUILD=$build

for script in "$root"/tests/*/test_"$what".sh "$root"/tests/test_"$what".sh; do
    [[ -f $script ]] && exec bash "$script"
done
suite=${what%%/*}
filter=$what
[[ $what == */* ]] || filter="$what/*"
for bin in test_unit test_e2e test_process test_ghost; do
    prog=$build/tests/$bin
    [[ -x $prog ]] || continue
    if "$prog" --list 2>/dev/null | grep -qx "$suite: [0-9]* tests\?"; then
        exec "$prog" --filter "$filter" --jobs 2
    fi
done
echo "one.sh: no suite $suite in $build/tests (built?) and no tests/*/test_$what.sh" >&2
exit 2
