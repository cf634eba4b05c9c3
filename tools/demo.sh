#!/usr/bin/env bash
# tools/demo.sh - `make demo`: the main job in one command.
#
# With an NVIDIA GPU: a real two-process CUDA IPC benchmark (512 MiB handle,
# opened and closed again and again), without and with the cache, then the
# importer's stats line. Without a GPU: the same flow against the test
# suite's stand-in driver, clearly marked SIMULATED.
set -u
cd "$(dirname "$0")/.." || exit 2

LIB=${IPCCACHE_LIB:-build/libipccache.so}
BUILD=${BUILD:-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
N=${DEMO_ITERS:-2000}

have_gpu() { nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

real_demo() {
    local bin=$BUILD/bench/ipcbench_shared
    mkdir -p "$BUILD/bench"
    if [ ! -x "$bin" ]; then
        echo "demo: building $bin"
        "$CUDA_HOME/bin/nvcc" -O2 -std=c++17 -cudart shared -o "$bin" tools/ipcbench.cu \
            -L"$CUDA_HOME/lib64/stubs" -lcuda -lpthread || exit 1
    fi
    local stats
    stats=$(mktemp -d)
    echo "demo: exporter and importer are separate processes; A = no cache, B = LD_PRELOAD=$LIB"
    "$bin" --out "$stats" --api runtime --sizes 512M --shim "$LIB" --real-iters 200 --held-iters 200 \
        --hit-iters 20000 --threads 1 --max-mode-seconds 1 |
        awk -F, 'NR == 1 { next }
                 $4 == "real_pair" || $4 == "shim_hit_pair" {
                     printf "  %-14s pass %-2s  median %9.1f us per open+close\n", $4, $9, $7 / 1000 }'
    echo "  the cached importer's stats line:"
    cat "$stats"/shim_stats_B.* 2>/dev/null | sed 's/^/    /'
    rm -rf "$stats"
}

simulated_demo() {
    local probe=$BUILD/tests/probe stats
    stats=$(mktemp)
    echo "demo: SIMULATED - no GPU here; the stand-in driver (tests/fake_cuda.c) counts real maps"
    echo "demo: one process opens and closes the same IPC handle $N times"
    echo "  without ipccache:"
    LD_LIBRARY_PATH=$BUILD/tests "$probe" openclose "$N" | grep -E '^(maps|unmaps|open_calls)=' | sed 's/^/    /'
    echo "  with LD_PRELOAD=$LIB:"
    LD_LIBRARY_PATH=$BUILD/tests LD_PRELOAD=$LIB IPCCACHE_STATS_AT_EXIT=1 IPCCACHE_STATS_FILE=$stats \
        "$probe" openclose "$N" | grep -E '^(maps|unmaps|open_calls)=' | sed 's/^/    /'
    echo "  its stats line:"
    sed 's/^/    /' "$stats"
    rm -f "$stats"
}

if have_gpu; then
    real_demo
else
    simulated_demo
fi
