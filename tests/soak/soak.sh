#!/usr/bin/env bash
#
# soak.sh BUILD LIBRARY - make soak: the stand-in soak (tests/soak/soak.c) run
# without the library, then with it, the verdict (soak_verdict.py) and the
# plots (soak_plot.py, when matplotlib is installed). Exits with the verdict.
#
#   SOAK_MINUTES    the run with the library (default 5; fractions work)
#   SOAK_SECONDS    the same in seconds (wins over SOAK_MINUTES)
#   SOAK_QUICK=1    120 s (CI; its 24 s without the library are too short to
#                   judge series by, soak_verdict.py says so)
#   SOAK_SEED       the fleet's random numbers (default 1)
#   SOAK_EXPORTERS  exporters (default from the seed: 4-8; at most 16)
#   SOAK_IMPORTERS  importers (default from the seed: 8-16; at most 48)
#   SOAK_OUT        where the runs go (default BUILD/soak/SEED)
#   SOAK_PRELOAD_EXTRA  a library preloaded after ipccache (the soak's own
#                   tests plant faults with it)
# The run without the library lasts a fifth as long (at least 10 s).
set -u

if [[ $# -ne 2 ]]; then
    echo "usage: tests/soak/soak.sh BUILD LIBRARY" >&2
    exit 2
fi
build=$1 lib=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
seed=${SOAK_SEED:-1}
if [[ ${SOAK_QUICK:-0} == 1 ]]; then
    seconds=120
elif [[ -n ${SOAK_SECONDS:-} ]]; then
    seconds=$SOAK_SECONDS
else
    seconds=$(awk -v m="${SOAK_MINUTES:-5}" 'BEGIN { print m * 60 }')
fi
exporters=${SOAK_EXPORTERS:-$((4 + seed % 5))}
importers=${SOAK_IMPORTERS:-$((8 + seed % 9))}
without=$(awk -v s="$seconds" 'BEGIN { w = s / 5; print (w < 10 ? 10 : w) }')
out=${SOAK_OUT:-$build/soak/$seed}
rm -rf "$out/with" "$out/without"
mkdir -p "$out" || exit 2
# The runs' sockets must fit a socket address (108 bytes): a short folder of their own.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-soak.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

echo "soak: $exporters exporters, $importers importers, seed $seed: ${without} s without the library, ${seconds} s with it"
preload=$lib${SOAK_PRELOAD_EXTRA:+ $SOAK_PRELOAD_EXTRA}
"$build/tests/soak" run "$tmp/without" "$without" "$seed" "$exporters" "$importers" || exit 2
"$build/tests/soak" run "$tmp/with" "$seconds" "$seed" "$exporters" "$importers" "$preload" || exit 2
for run in with without; do
    mkdir -p "$out/$run"
    cp "$tmp/$run"/{importers.csv,machine.csv,summary.txt,ghosts.txt} "$out/$run/"
    cp -r "$tmp/$run/logs" "$out/$run/"
done

python3 "$here/soak_verdict.py" "$out/with" "$out/without" | tee "$out/verdict.txt"
status=${PIPESTATUS[0]}
# Debian's matplotlib is its own python3's; another python3 may come first on PATH.
plotter=
for py in python3 /usr/bin/python3; do
    if "$py" -c 'import matplotlib' 2>/dev/null; then plotter=$py; break; fi
done
if [[ -n $plotter ]]; then
    "$plotter" "$here/soak_plot.py" "$out/plots" "$out/with" "$out/without"
else
    echo "soak: plots skipped: matplotlib is not installed (Debian: apt-get install python3-matplotlib)"
fi
echo "soak: CSVs, logs and verdict in $out"
exit "$status"
