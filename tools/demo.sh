#!/usr/bin/env bash
# tools/demo.sh - `make demo`: the main job in one command.
#
# With an NVIDIA GPU: a real two-process CUDA IPC benchmark (512 MiB handle,
# opened and closed again and again), without and with the cache, then the
# importer's stats line. Without a GPU: the same flow against the test
# suite's stand-in driver, clearly marked SIMULATED. Both end with one
# "demo: result:" line.
set -u
cd "$(dirname "$0")/.." || exit 2

LIB=${IPCCACHE_LIB:-build/libipccache.so}
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
N=${DEMO_ITERS:-2000}

# DEMO_SIMULATED=1 takes the simulated flow even on a GPU machine (the tests).
have_gpu() { [ "${DEMO_SIMULATED:-0}" != 1 ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

# The value of integer KEY in the JSON stats line on stdin.
stat_of() { grep -o "\"$1\":[0-9]*" | tail -n 1 | cut -d: -f2; }

real_demo() {
    local bin=$BUILD/bench/ipcbench_shared
    mkdir -p "$BUILD/bench"
    if [ ! -x "$bin" ]; then
        echo "demo: building $bin"
        "$CUDA_HOME/bin/nvcc" -O2 -std=c++17 -cudart shared -o "$bin" tools/bench/ipcbench.cu \
            -L"$CUDA_HOME/lib64/stubs" -lcuda -lpthread || exit 1
    fi
    local stats rows
    stats=$(mktemp -d)
    echo "demo: exporter and importer are separate processes; A = no cache, B = LD_PRELOAD=$LIB"
    rows=$("$bin" --out "$stats" --api runtime --sizes 512M --shim "$LIB" --real-iters 200 \
        --held-iters 200 --hit-iters 20000 --threads 1 --max-mode-seconds 1 |
        awk -F, 'NR > 1 && ($4 == "real_pair" || $4 == "shim_hit_pair") { print $4, $9, $7 / 1000 }')
    echo "$rows" | awk '{ printf "  %-14s pass %-2s  median %9.1f us per open+close\n", $1, $2, $3 }'
    echo "  the cached importer's stats line:"
    cat "$stats"/shim_stats_B.* 2>/dev/null | sed 's/^/    /'
    local line
    line=$(cat "$stats"/shim_stats_B.* 2>/dev/null)
    echo "$rows" | awk -v opens="$(stat_of opens <<<"$line")" -v maps="$(stat_of real_opens <<<"$line")" '
        $1 == "real_pair" { real += $3; n++ } $1 == "shim_hit_pair" { hit = $3 }
        END { if (n && hit > 0)
                  printf "demo: result: one open+close of a 512 MiB handle costs %.1f us without the " \
                         "cache and %.2f us with it (%.0fx less); the cached importer made %s real " \
                         "map(s) for %s opens\n", real / n, hit, real / n / hit, maps, opens
              else print "demo: result: no timing rows (see the output above)" }'
    rm -rf "$stats"
}

simulated_demo() {
    local probe=$BUILD/tests/probe stats without with line
    stats=$(mktemp)
    echo "demo: SIMULATED - no GPU here; the stand-in driver (tests/standin/fake_cuda.c) counts real maps"
    echo "demo: one process opens and closes the same IPC handle $N times"
    echo "  without ipccache:"
    without=$(LD_LIBRARY_PATH=$BUILD/tests "$probe" openclose "$N" | grep -E '^(maps|unmaps|open_calls)=')
    sed 's/^/    /' <<<"$without"
    echo "  with LD_PRELOAD=$LIB:"
    with=$(LD_LIBRARY_PATH=$BUILD/tests LD_PRELOAD=$LIB IPCCACHE_STATS_AT_EXIT=1 IPCCACHE_STATS_FILE=$stats \
        "$probe" openclose "$N" | grep -E '^(maps|unmaps|open_calls)=')
    sed 's/^/    /' <<<"$with"
    echo "  its stats line, written at exit:"
    sed 's/^/    /' "$stats"
    line=$(cat "$stats")
    rm -f "$stats"
    echo "  (real_closes is 0, like unmaps above: the line is written just before the cache closes its"
    echo "  idle mapping at exit; until then the mapping stays cached for the next open.)"
    echo "demo: on a GPU host make demo times each open+close; the stand-in's map costs nothing"
    echo "demo: result: $N opens of one handle made $(sed -n 's/^maps=//p' <<<"$without") driver maps" \
        "without ipccache and $(sed -n 's/^maps=//p' <<<"$with") with it ($(stat_of hits <<<"$line") hits)"
}

if have_gpu; then
    real_demo
else
    simulated_demo
fi
