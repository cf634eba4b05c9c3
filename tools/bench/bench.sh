#!/usr/bin/env bash
# tools/bench/bench.sh - `make bench`: what does ipccache save?
#
# 1. tools/bench/ipcbench.cu, built as build/bench/ipcbench_{static,shared}: CUDA IPC
#    open+close pair latency by allocation size, runtime API (cudart static
#    and shared) and driver API; each run is A1 (no shim) / B (shim) / A2 (no
#    shim) inside one exporter process.
# 2. tools/bench/bench_sglang_pattern.py: SGLang's CUDA IPC multimodal transport,
#    run A/B/A as cache on / off / on.
# 3. tests/gpu/vmm_rebuild.c (vmm): PyTorch's expandable-segments rebuild in
#    C on the driver API, A/B/A, with each driver call timed (the cached VMM
#    hit path), beside ipcbench's legacy pair at 512 MiB on the driver API.
# 4. tools/bench/bench_torch_vmm.py (torch): PyTorch, legacy IPC and expandable
#    segments, A/B/A: rebuild + use + release of a 1 MiB slice of a 512 MiB
#    pool, and the RL weight-sync pattern (134 tensors, 2.35 GiB per step).
#    With the part "shapes": the weight sync's shapes of issue 17 (one tensor
#    at a time, reversed every other step, shuffled, all at once, 512 MiB
#    buckets, two engines in turn), both allocators, A/B/A, steps/s, per-step
#    ms and the engine's VMM map hits (--quick with BENCH_QUICK=1).
# 5. tests/gpu/ghost_free.cu (ghost): what the exporter's free of exported
#    memory costs with 0, 1 and 8 importers holding idle mappings, and its
#    allocation and free of other memory, A/B/A (the preload on both sides).
# 6. tools/sglang_peer/driver.py (sglang-code): SGLang's own transport classes
#    (the copy `make peer-fetch` put in PEER_DIR/sglang), legacy and expandable
#    segments, SGLang's cache off and on, A/B/A per repetition; its table goes
#    into summary.md beside the pattern's (skipped, said so, without the copy).
# 7. hitpath: the legacy hit pair alone, A/B/A, threads 1/2/4/8/16 on one
#    handle and on a handle each (16 allocations of 2 MiB), driver API and
#    shared cudart, with cudart's own cost of a call (its pair beside the
#    driver's entry point called directly), threads pinned a CPU each beside
#    one thread alone on each of those CPUs, and the driver's own floor with
#    threads; tools/bench/hitpath_report.py prints the table into hitpath.md.
# 8. tools/bench/engine/engine_bench.py (engine): an engine's own numbers with
#    the GPU busy: SGLang's transport between a producer (the tokenizer
#    worker) and a scheduler running Qwen2.5-VL-3B's language model (random
#    weights) on the features: requests/s, time to first token, the
#    transport's share; then the weight sync with SGLang's serializer and
#    buckets while the engine forwards; A1/B/A2, legacy and expandable,
#    SGLang's cache off and on; tables in engine.md and summary.md (skipped,
#    said so, without `make peer-fetch`'s copy). BENCH_TP=N: N scheduler ranks.
# 9. tools/bench/soak_gpu.py (soak, not in the default set): the engine's
#    serving (SGLang's cache off, BENCH_SOAK_REQUESTS requests) and
#    BENCH_SOAK_STEPS per-tensor weight syncs, legacy and expandable, without
#    and with the library, values checked (--check); every process's RSS and
#    fds and the device's memory sampled each second; soak.md and
#    raw/soak.png hold the verdict (flat with the library as without).
# 10. tools/bench/rl/rl_bench.py (rl): vLLM's, verl's and OpenRLHF's own weight-sync
#    code (the files `make peer-fetch` put in PEER_DIR/rl), a trainer and an
#    engine with Qwen2.5-3B's shapes, every case (vLLM per tensor and packed,
#    verl's buckets, OpenRLHF's per-parameter calls) with the engine's forwards
#    in flight and idle, both allocators, A1/B/A2: step times, values checked
#    every sync, free memory and the library's counters per sync; tables in
#    rl.md and summary.md (skipped, said so, without the fetched copy).
#    BENCH_RL: more rl_bench.py run options (e.g. "--cases vllm-tensor --syncs 5";
#    with --timeline, rl-timeline.md too).
# 11. tools/bench/rl/mm_ipc_bench.py (vllm-mm): vLLM's multimodal tensor queue
#    (vllm/v1/engine/tensor_ipc.py of the same fetched copy, its sender and
#    receiver unchanged) between an API server making fresh 8 MiB bf16 image
#    features on the GPU and an engine core checking each, both allocators,
#    A1/B/A2: requests/s, per-feature latency, values, free memory and the
#    library's counters; tables in vllm-mm.md and summary.md (skipped, said so,
#    without the fetched copy). BENCH_VLLM_MM: more mm_ipc_bench.py run options.
# 12. tools/bench/plot_bench.py: medians over repetitions, bench.png, summary.md
#    (also printed: the tables for the README's Performance section); then
#    tools/bench/bench_vmm_report.py adds the tables of 3-5 to summary.md.
# With two or more GPUs, everything but 5 is also run across devices (GPU0 -> GPU1).
#
# Environment:
#   IPCCACHE_LIB  the shim (default build/libipccache.so)
#   BENCH_OUT     results folder (default results/<yyyymmdd>-<gpu-name>)
#   BENCH_REPS    repetitions (default 3; 1 with BENCH_QUICK=1)
#   BENCH_QUICK=1 smaller iteration counts (about 2 minutes on one GPU)
#   BENCH_PARTS   which parts run (default "ipc sglang sglang-code vmm torch shapes ghost hitpath engine";
#                 rl and vllm-mm only when named)
#   BENCH_TP      the engine part's scheduler ranks, one per GPU (default 1)
#   BENCH_ENGINE  the engine part's pieces (default "serve sync")
#   BENCH_PROFILE=1 the engine part also writes torch.profiler tables (raw/profiles/):
#                 serving batches 20-35 (their figures then carry the profiler's cost),
#                 one extra, untimed weight-sync step
#   BENCH_SOAK_REQUESTS, BENCH_SOAK_STEPS  the soak's serving requests and weight syncs
#                 per pass (default 1500 and 100; quick: 200 and 20)
#   BENCH_SHAPES  the part shapes' list (default one,one_synced,reversed,shuffled,all,buckets,two)
#   PEER_DIR      where `make peer-fetch` put sglang/ (default .peer)
#   CUDA_HOME     default /usr/local/cuda; NVCC, PYTHON may override the tools
set -u -o pipefail

cd "$(dirname "$0")/../.." || exit 2

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
PYTHON=${PYTHON:-python3}
LIB=${IPCCACHE_LIB:-build/libipccache.so}
QUICK=${BENCH_QUICK:-0}
BUILD=build/bench
FAILURES=0
PARTS=" ${BENCH_PARTS:-ipc sglang sglang-code vmm torch shapes ghost hitpath engine} "
SHAPES=${BENCH_SHAPES:-one,one_synced,reversed,shuffled,all,buckets,two}
SGLANG_FETCHED=${PEER_DIR:-.peer}/sglang
RL_FETCHED=${PEER_DIR:-.peer}/rl

if [ "$QUICK" = 1 ]; then
    REPS=${BENCH_REPS:-1}
    IPC_ARGS=(--real-iters 50 --held-iters 500 --hit-iters 5000 --max-mode-seconds 0.5)
    HIT_ARGS=(--real-iters 20 --held-iters 2000 --hit-iters 200000 --max-mode-seconds 0.5)
    SG_ARGS=(--warmup 20 --requests 200 --rate-requests 200 --rate 200)
    VMM_ITERS=50 TORCH_ARGS=(--features 200 --steps 10 --warmup 2) GHOST_ITERS=20
    SGLANG_CODE_ARGS=(--features 200 --warmup 10)
    ENGINE_SERVE_ARGS=(--requests 48 --burst 24 --warmup 8) ENGINE_SYNC_ARGS=(--steps 3 --warmup 1)
    SOAK_REQUESTS=${BENCH_SOAK_REQUESTS:-200} SOAK_STEPS=${BENCH_SOAK_STEPS:-20}
    RL_ARGS=(--syncs 5 --warmup 1) MM_ARGS=(--requests 50 --warmup 5)
else
    REPS=${BENCH_REPS:-3}
    IPC_ARGS=(--real-iters 200 --held-iters 2000 --hit-iters 20000 --max-mode-seconds 1.5)
    HIT_ARGS=(--real-iters 20 --held-iters 5000 --hit-iters 1000000 --max-mode-seconds 1.5)
    SG_ARGS=(--warmup 50 --requests 500 --rate-requests 500 --rate 200)
    VMM_ITERS=200 TORCH_ARGS=(--features 500 --steps 60 --warmup 5) GHOST_ITERS=200
    SGLANG_CODE_ARGS=(--features 500 --warmup 20)
    ENGINE_SERVE_ARGS=(--requests 128 --burst 48 --warmup 12) ENGINE_SYNC_ARGS=(--steps 6 --warmup 1)
    SOAK_REQUESTS=${BENCH_SOAK_REQUESTS:-1500} SOAK_STEPS=${BENCH_SOAK_STEPS:-100}
    RL_ARGS=(--syncs 20 --warmup 2) MM_ARGS=(--requests 200 --warmup 20)
fi
RUN_TIMEOUT=300

note() { echo "bench: $(date +%T) $*" >&2; }

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${NGPU:-0}" -lt 1 ]; then
    echo "bench: no NVIDIA GPU found; skipping"
    exit 0
fi
if [ ! -f "$LIB" ]; then
    echo "bench: $LIB not found (build it first, or set IPCCACHE_LIB)" >&2
    exit 2
fi
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -n1)
SLUG=$(echo "${GPU_NAME:-gpu}" | tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9][^a-z0-9]*/-/g' -e 's/^-//' -e 's/-$//')
OUT=${BENCH_OUT:-results/$(date +%Y%m%d)-$SLUG}
RAW=$OUT/raw
mkdir -p "$RAW" "$BUILD"
note "$NGPU GPU(s) ($GPU_NAME), $REPS repetition(s), quick=$QUICK, results in $OUT"

gpu_arch() {
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i 0 2>/dev/null | tr -d ' .')
    case "$cc" in ''|*[!0-9]*) cc=90 ;; esac
    echo "-gencode arch=compute_$cc,code=[sm_$cc,compute_$cc]"
}

build_ipcbench() {
    local rt arch
    arch=$(gpu_arch)
    for rt in static shared; do
        # shellcheck disable=SC2086  # $arch is several words on purpose
        "$NVCC" -O2 -std=c++17 $arch -cudart "$rt" -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64" \
            -o "$BUILD/ipcbench_$rt" tools/bench/ipcbench.cu -L"$CUDA_HOME/lib64/stubs" -lcuda -lpthread \
            >"$RAW/build_ipcbench_$rt.log" 2>&1 || { note "build of ipcbench_$rt failed: $RAW/build_ipcbench_$rt.log"; return 1; }
    done
}

write_machine_json() {
    local smi_cuda nvcc_rel
    smi_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n1)
    nvcc_rel=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n1)
    GPU_NAME="$GPU_NAME" NGPU="$NGPU" SMI_CUDA="$smi_cuda" NVCC_REL="$nvcc_rel" REPS="$REPS" QUICK="$QUICK" \
    DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0 2>/dev/null | head -n1) \
    "$PYTHON" - "$OUT/machine.json" <<'EOF'
import json, os, sys, time
try:
    import torch
    torch_version, torch_cuda = torch.__version__, torch.version.cuda
except Exception:
    torch_version = torch_cuda = None
e = os.environ
info = {
    "gpu_name": e["GPU_NAME"], "gpu_count": int(e["NGPU"]), "driver_version": e["DRIVER"],
    "cuda_version": e["SMI_CUDA"] or None, "nvcc_version": e["NVCC_REL"] or None,
    "torch_version": torch_version, "torch_cuda": torch_cuda, "cpu_count": os.cpu_count(),
    "reps": int(e["REPS"]), "quick": e["QUICK"] == "1", "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
}
with open(sys.argv[1], "w") as f:
    json.dump(info, f, indent=2)
EOF
}

# ipcbench_run TAG BINARY ARGS...: one A1/B/A2 exporter run.
ipcbench_run() {
    local tag=$1 bin=$2; shift 2
    local dir=$RAW/ipcbench_$tag.d
    mkdir -p "$dir"
    note "ipcbench $tag"
    if ! timeout "$RUN_TIMEOUT" env -u LD_PRELOAD "$bin" --shim "$LIB" --out "$dir" "${IPC_ARGS[@]}" "$@" \
        >"$RAW/ipcbench_$tag.csv" 2>"$RAW/ipcbench_$tag.log"; then
        note "ipcbench $tag failed (see $RAW/ipcbench_$tag.log)"
        FAILURES=$((FAILURES + 1))
    fi
}

# sglang_run TAG LABEL on|off ARGS...
sglang_run() {
    local tag=$1 label=$2 cache=$3; shift 3
    local out=$RAW/sglang_${tag}_$label.json log=$RAW/sglang_${tag}_$label.log
    local -a envs=(-u LD_PRELOAD)
    if [ "$cache" = on ]; then
        envs=(-u IPCCACHE_DISABLE LD_PRELOAD="$LIB" IPCCACHE_STATS_AT_EXIT=1
              IPCCACHE_STATS_FILE="$RAW/sglang_stats_${tag}_$label.%p")
    fi
    note "sglang pattern $tag $label"
    if ! timeout "$RUN_TIMEOUT" env "${envs[@]}" "$PYTHON" tools/bench/bench_sglang_pattern.py "${SG_ARGS[@]}" \
        --label "$label" --out "$out" "$@" >"$log" 2>&1; then
        note "sglang pattern $tag $label failed (see $log)"
        FAILURES=$((FAILURES + 1))
    fi
}

torch_ready() {
    "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

part() { [[ $PARTS == *" $1 "* ]]; }

# fresh BINARY SOURCE: BINARY exists and is newer than SOURCE (kept, not rebuilt).
fresh() { [ -x "$1" ] && [ "$1" -nt "$2" ]; }

# build_gpu_program NAME SOURCE [nvcc args...]: build/bench/NAME, once.
build_gpu_program() {
    local name=$1 src=$2 arch; shift 2
    fresh "$BUILD/$name" "$src" && return 0
    arch=$(gpu_arch)
    # shellcheck disable=SC2086  # $arch is several words on purpose
    "$NVCC" -O2 $arch -o "$BUILD/$name" "$src" "$@" >"$RAW/build_$name.log" 2>&1 ||
        { note "build of $name failed: $RAW/build_$name.log"; return 1; }
}

# abba TAG COMMAND...: COMMAND three times, A1 without the shim, B with it
# (stats at exit into raw/), A2 without; stdout to raw/TAG_<pass>.txt.
abba() {
    local tag=$1 pass; shift
    for pass in A1 B A2; do
        local -a envs=(-u LD_PRELOAD)
        [ "$pass" = B ] && envs=(-u IPCCACHE_DISABLE LD_PRELOAD="$LIB" IPCCACHE_STATS_AT_EXIT=1
                                 IPCCACHE_STATS_FILE="$RAW/stats_${tag}_B.%p.json")
        note "$tag $pass"
        if ! timeout "$RUN_TIMEOUT" env "${envs[@]}" "$@" >"$RAW/${tag}_$pass.txt" 2>"$RAW/${tag}_$pass.log"; then
            note "$tag $pass failed (see $RAW/${tag}_$pass.log)"
            FAILURES=$((FAILURES + 1))
        fi
    done
}

# The cached VMM rebuild call by call (26 chunks of 20 MiB, PyTorch's layout
# of a 512 MiB pool), and the legacy pair on the driver API beside it.
bench_vmm() {
    local dev
    build_gpu_program vmm_rebuild tests/gpu/vmm_rebuild.c -lcuda || { FAILURES=$((FAILURES + 1)); return; }
    fresh "$BUILD/ipcbench_shared" tools/bench/ipcbench.cu || build_ipcbench || return
    for dev in "${DEVS[@]}"; do
        abba "vmm_rebuild_d$dev" "$BUILD/vmm_rebuild" "$VMM_ITERS" 26 20 "$dev"
    done
    for dev in "${DEVS[@]}"; do
        note "legacy pair d$dev"
        timeout "$RUN_TIMEOUT" env -u LD_PRELOAD "$BUILD/ipcbench_shared" --api driver --sizes 512M \
            --threads 1 --device "$dev" --shim "$LIB" "${IPC_ARGS[@]}" \
            >"$RAW/legacy_pair_d$dev.csv" 2>"$RAW/legacy_pair_d$dev.log" ||
            { note "legacy pair d$dev failed"; FAILURES=$((FAILURES + 1)); }
    done
}

# PyTorch, both allocators; A/B/A inside each run (the script spawns them).
bench_torch() {
    local alloc devices
    devices=$(IFS=,; echo "${DEVS[*]}")
    for alloc in legacy expandable; do
        note "torch $alloc (consumers on GPU $devices)"
        timeout "$((RUN_TIMEOUT * 2))" env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF \
            "$PYTHON" tools/bench/bench_torch_vmm.py --alloc "$alloc" --shim "$LIB" \
            --consumer-devices "$devices" "${TORCH_ARGS[@]}" --stats-dir "$RAW/torch_stats" \
            --out "$RAW/torch_$alloc.json" >"$RAW/torch_$alloc.txt" 2>"$RAW/torch_$alloc.log" ||
            { note "torch $alloc failed (see $RAW/torch_$alloc.log)"; FAILURES=$((FAILURES + 1)); }
    done
}

# The weight sync's shapes (issue 17), both allocators, A/B/A, GPU 0; each
# repetition runs legacy then expandable, so a ratio compares neighbours.
bench_shapes() {
    local alloc rep quick=()
    [ "$QUICK" = 1 ] && quick=(--quick)
    for rep in $(seq 1 "$REPS"); do
        for alloc in legacy expandable; do
            note "shapes $alloc r$rep"
            timeout "$((RUN_TIMEOUT * 4))" env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF \
                "$PYTHON" tools/bench/bench_torch_vmm.py --alloc "$alloc" --shim "$LIB" "${quick[@]}" \
                --shapes "$SHAPES" --stats-dir "$RAW/shapes_stats" --out "$RAW/shapes_${alloc}_r$rep.json" \
                >"$RAW/shapes_${alloc}_r$rep.txt" 2>"$RAW/shapes_${alloc}_r$rep.log" ||
                { note "shapes $alloc r$rep failed (see $RAW/shapes_${alloc}_r$rep.log)"; FAILURES=$((FAILURES + 1)); }
        done
    done
}

# The exporter's frees, 512 MiB, same GPU; the importers inherit the preload.
bench_ghost() {
    local n
    build_gpu_program ghost_free tests/gpu/ghost_free.cu || { FAILURES=$((FAILURES + 1)); return; }
    for n in 1 8 0; do
        abba "ghost_free_i$n" "$BUILD/ghost_free" --size $((512 << 20)) --importers "$n" --iters "$GHOST_ITERS"
    done
}

# sglang_tree WHAT: prepares SGLang's fetched files as $BUILD/sglang-tree; 1 (said
# as WHAT's skip, or counted as a failure) when they are missing or do not prepare.
SGLANG_TREE=$BUILD/sglang-tree
sglang_tree() {
    if [ ! -f "$SGLANG_FETCHED/MANIFEST" ]; then
        note "$1: skipped: no $SGLANG_FETCHED/MANIFEST (run make peer-fetch where there is a network)"
        return 1
    fi
    "$PYTHON" tools/sglang_peer/prepare.py "$SGLANG_FETCHED" "$SGLANG_TREE" || { FAILURES=$((FAILURES + 1)); return 1; }
}

# with_sglang PASS NAME SECONDS CMD...: CMD (a Python program) on SGLang's tree, without the
# library (A1, A2) or with it (B: its stats lines in $RAW/stats_NAME_B.%p.json); its
# output in $RAW/NAME_PASS.txt; a failure is said and counted.
with_sglang() {
    local pass=$1 name=$2 seconds=$3 tree=$SGLANG_TREE
    shift 3
    local -a envs=(-u LD_PRELOAD)
    [ "$pass" = B ] && envs=(-u IPCCACHE_DISABLE LD_PRELOAD="$LIB" IPCCACHE_STATS_AT_EXIT=1
                             IPCCACHE_STATS_FILE="$RAW/stats_${name}_B.%p.json")
    timeout "$seconds" env -u PYTORCH_CUDA_ALLOC_CONF "${envs[@]}" \
        PYTHONPATH="$tree/src:tools/sglang_peer/site" SGLANG_PEER_DEPS="$tree/deps" \
        SGLANG_PEER_STUB_TRANSFORMERS=1 "$@" >"$RAW/${name}_$pass.txt" 2>&1 ||
        { note "$name $pass failed (see $RAW/${name}_$pass.txt)"; FAILURES=$((FAILURES + 1)); }
}

# SGLang's own code, A1 (no shim) / B (shim) / A2 (no shim) per repetition.
bench_sglang_code() {
    local rep pass
    sglang_tree "SGLang's code" || return
    for rep in $(seq 1 "$REPS"); do
        for pass in A1 B A2; do
            note "SGLang's code r$rep $pass"
            with_sglang "$pass" "sglang_code_r$rep" "$((RUN_TIMEOUT * 2))" "$PYTHON" tools/sglang_peer/driver.py run \
                "${SGLANG_CODE_ARGS[@]}" --out "$RAW/sglang_code_r${rep}_$pass.json"
        done
    done
}

# The SGLang-code tables, one per repetition, into summary.md.
report_sglang_code() {
    local rep
    [ -f "$RAW/sglang_code_r1_B.json" ] || return 0
    {
        echo
        echo "## SGLang's own transport (sglang $(cat "$SGLANG_FETCHED/VERSION"), tools/sglang_peer/driver.py)"
        echo
        echo "Median per feature (reconstruct + check + release), without ipccache (A1 / A2) and with it (B)."
        for rep in $(seq 1 "$REPS"); do
            echo
            echo "Repetition $rep:"
            echo
            "$PYTHON" tools/sglang_peer/driver.py report "$RAW/sglang_code_r${rep}_A1.json" \
                "$RAW/sglang_code_r${rep}_B.json" "$RAW/sglang_code_r${rep}_A2.json" || return 1
        done
    } >>"$OUT/summary.md"
}

# The hit pair with threads, one 512 MiB handle shared or 16 of 2 MiB, one each.
bench_hitpath() {
    local rep api csvs=()
    fresh "$BUILD/ipcbench_shared" tools/bench/ipcbench.cu || build_ipcbench || { FAILURES=$((FAILURES + 1)); return; }
    for rep in $(seq 1 "$REPS"); do
        for api in driver runtime; do
            note "hitpath $api r$rep"
            timeout "$RUN_TIMEOUT" env -u LD_PRELOAD "$BUILD/ipcbench_shared" --api "$api" --sizes 512M \
                --threads 1,2,4,8,16 --distinct 16 --distinct-size 2M --pin --shim "$LIB" "${HIT_ARGS[@]}" \
                >"$RAW/hitpath_${api}_r$rep.csv" 2>"$RAW/hitpath_${api}_r$rep.log" ||
                { note "hitpath $api r$rep failed (see $RAW/hitpath_${api}_r$rep.log)"; FAILURES=$((FAILURES + 1)); }
            csvs+=("$RAW/hitpath_${api}_r$rep.csv")
        done
    done
    "$PYTHON" tools/bench/hitpath_report.py "${csvs[@]}" | tee "$OUT/hitpath.md" || FAILURES=$((FAILURES + 1))
}

# The engine's own numbers (tools/bench/engine/engine_bench.py), A1/B/A2 in
# one run; each pass runs every allocator and SGLang cache setting.
bench_engine() {
    local piece pass
    sglang_tree engine || return
    for piece in ${BENCH_ENGINE:-serve sync}; do
        local -a args=("${ENGINE_SERVE_ARGS[@]}" --tp "${BENCH_TP:-1}")
        [ "$piece" = sync ] && args=("${ENGINE_SYNC_ARGS[@]}")
        [ "${BENCH_PROFILE:-0}" = 1 ] && args+=(--profile-dir "$RAW/profiles")
        for pass in A1 B A2; do
            note "engine $piece $pass"
            with_sglang "$pass" "engine_$piece" "$((RUN_TIMEOUT * 3))" PYTHONUNBUFFERED=1 "$PYTHON" \
                tools/bench/engine/engine_bench.py "$piece" "${args[@]}" --label "$pass" \
                --out "$RAW/engine_${piece}_$pass.json"
        done
    done
}

# The engine's tables into engine.md and summary.md.
report_engine() {
    local piece
    for piece in serve sync; do
        [ -f "$RAW/engine_${piece}_B.json" ] || continue
        {
            echo
            echo "## The engine's own numbers: $piece (tools/bench/engine/engine_bench.py)"
            echo
            "$PYTHON" tools/bench/engine/engine_bench.py report "$RAW/engine_${piece}_A1.json" \
                "$RAW/engine_${piece}_B.json" "$RAW/engine_${piece}_A2.json" || return 1
        } | tee -a "$OUT/engine.md" >>"$OUT/summary.md"
    done
}

# The GPU soak: each piece x allocator without, then with the library, every
# process of the run sampled (tools/bench/soak_gpu.py sample).
bench_soak() {
    local alloc piece pass label
    sglang_tree soak || return
    for alloc in legacy expandable; do
        for piece in serve sync; do
            local -a args=(serve --caches off --burst 0 --warmup 12 --requests "$SOAK_REQUESTS")
            [ "$piece" = sync ] && args=(sync --modes tensor --steps "$SOAK_STEPS" --warmup 5)
            for pass in without with; do
                label=A1
                [ "$pass" = with ] && label=B
                note "soak $piece $alloc $pass"
                with_sglang "$label" "soak_${piece}_$alloc" "$((RUN_TIMEOUT * 3))" PYTHONUNBUFFERED=1 \
                    "$PYTHON" tools/bench/soak_gpu.py sample --out "$RAW/soak_${piece}_${alloc}_$pass.csv" -- \
                    "$PYTHON" tools/bench/engine/engine_bench.py "${args[@]}" --allocs "$alloc" --check \
                    --label "$label" --timeout 600 --out "$RAW/soak_${piece}_${alloc}_$pass.json"
            done
        done
    done
}

# The RL projects' weight sync (tools/bench/rl/rl_bench.py), A1/B/A2; each pass
# runs every case, both allocators. Their files, unpacked once, and their stand-ins
# (tools/rl_peer/site) load in every interpreter of the run.
RL_TREE=$BUILD/rl-tree
# rl_tree_ready PART: the fetched copy unpacked into RL_TREE; else PART is said
# skipped (no copy) or counted failed (a copy that does not match its MANIFEST).
rl_tree_ready() {
    if [ ! -f "$RL_FETCHED/MANIFEST" ]; then
        note "$1: skipped: no $RL_FETCHED/MANIFEST (run make peer-fetch where there is a network)"
        return 1
    fi
    "$PYTHON" tools/rl_peer/prepare.py "$RL_FETCHED" "$RL_TREE" || { FAILURES=$((FAILURES + 1)); return 1; }
}

# rl_tree_passes NAME LIMIT SCRIPT ARGS...: `SCRIPT run ARGS` A1/B/A2 (the
# library preloaded in B) with the fetched tree and its stand-ins on PYTHONPATH,
# each pass at most LIMIT s; raw/NAME_<pass>.json and .txt.
rl_tree_passes() {
    local name=$1 limit=$2 script=$3 pass
    shift 3
    for pass in A1 B A2; do
        local -a envs=(-u LD_PRELOAD)
        [ "$pass" = B ] && envs=(-u IPCCACHE_DISABLE LD_PRELOAD="$LIB" IPCCACHE_STATS_FILE="$RAW/stats_${name}_B.%p.json")
        note "$name $pass"
        timeout "$limit" env -u PYTORCH_CUDA_ALLOC_CONF "${envs[@]}" PYTHONUNBUFFERED=1 \
            PYTHONPATH="$RL_TREE/src:tools/rl_peer/site" RL_PEER_DEPS="$RL_TREE/deps" VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
            "$PYTHON" "$script" run "$@" --label "$pass" --out "$RAW/${name}_$pass.json" >"$RAW/${name}_$pass.txt" 2>&1 ||
            { note "$name $pass failed (see $RAW/${name}_$pass.txt)"; FAILURES=$((FAILURES + 1)); }
    done
}

bench_rl() {
    rl_tree_ready rl || return
    # shellcheck disable=SC2206  # BENCH_RL is several words on purpose
    local -a extra=(${BENCH_RL:-})
    rl_tree_passes rl "$((RUN_TIMEOUT * 4))" tools/bench/rl/rl_bench.py "${RL_ARGS[@]}" "${extra[@]}"
}

# vLLM's multimodal tensor queue (tools/bench/rl/mm_ipc_bench.py), A1/B/A2; each
# pass runs both allocators.
bench_vllm_mm() {
    rl_tree_ready vllm-mm || return
    # shellcheck disable=SC2206  # BENCH_VLLM_MM is several words on purpose
    local -a extra=(${BENCH_VLLM_MM:-})
    rl_tree_passes vllm_mm "$((RUN_TIMEOUT * 2))" tools/bench/rl/mm_ipc_bench.py "${MM_ARGS[@]}" "${extra[@]}"
}

# The vllm-mm tables into vllm-mm.md and summary.md.
report_vllm_mm() {
    [ -f "$RAW/vllm_mm_B.json" ] || return 0
    {
        echo
        echo "## vLLM's multimodal tensor queue ($(head -n1 "$RL_FETCHED/VERSIONS"), vllm/v1/engine/tensor_ipc.py; tools/bench/rl/mm_ipc_bench.py)"
        echo
        "$PYTHON" tools/bench/rl/mm_ipc_bench.py report "$RAW/vllm_mm_A1.json" "$RAW/vllm_mm_B.json" \
            "$RAW/vllm_mm_A2.json" || return 1
    } | tee -a "$OUT/vllm-mm.md" >>"$OUT/summary.md"
}

# The RL tables into rl.md and summary.md.
report_rl() {
    [ -f "$RAW/rl_B.json" ] || return 0
    {
        echo
        echo "## RL weight sync with the projects' own code ($(tr '\n' ' ' <"$RL_FETCHED/VERSIONS"| sed 's/ $//'); tools/bench/rl/rl_bench.py)"
        echo
        "$PYTHON" tools/bench/rl/rl_bench.py report "$RAW/rl_A1.json" "$RAW/rl_B.json" "$RAW/rl_A2.json" || return 1
    } | tee -a "$OUT/rl.md" >>"$OUT/summary.md"
    # With --timeline in BENCH_RL: each cell's median sync in every process.
    case " ${BENCH_RL:-} " in
    *" --timeline "*)
        "$PYTHON" tools/bench/rl/rl_bench.py timeline "$RAW/rl_A1.json" "$RAW/rl_B.json" "$RAW/rl_A2.json" \
            >"$OUT/rl-timeline.md" || return 1 ;;
    esac
}

bench_ipc_sglang() {
    local rep dev have_torch=$1
    build_ipcbench || exit 1
    for rep in $(seq 1 "$REPS"); do
        for dev in "${DEVS[@]}"; do
            # Variants alternate within a repetition so that drift spreads evenly.
            if part ipc; then
                ipcbench_run "runtime_static_d${dev}_r$rep" "$BUILD/ipcbench_static" --api runtime --device "$dev"
                ipcbench_run "runtime_shared_d${dev}_r$rep" "$BUILD/ipcbench_shared" --api runtime --device "$dev"
                ipcbench_run "driver_d${dev}_r$rep" "$BUILD/ipcbench_shared" --api driver --device "$dev"
            fi
            if part sglang && [ "$have_torch" = 1 ]; then
                sglang_run "d${dev}_r$rep" A1-on on --device-consumer "$dev"
                sglang_run "d${dev}_r$rep" B-off off --device-consumer "$dev"
                sglang_run "d${dev}_r$rep" A2-on on --device-consumer "$dev"
            fi
        done
    done
}

main() {
    local have_torch=0 started=$SECONDS
    DEVS=(0)
    [ "$NGPU" -ge 2 ] && DEVS=(0 1)
    if part sglang || part sglang-code || part torch || part shapes || part engine || part soak || part rl || part vllm-mm; then
        torch_ready && have_torch=1
        [ "$have_torch" = 1 ] || note "python3 with CUDA torch not found: the PyTorch benchmarks are skipped"
    fi
    # A run in parts (BENCH_PARTS) into one folder writes it once.
    [ -f "$OUT/machine.json" ] || write_machine_json || note "machine.json not written"
    if part ipc || part sglang; then bench_ipc_sglang "$have_torch"; fi
    if part sglang-code && [ "$have_torch" = 1 ]; then bench_sglang_code; fi
    if part vmm; then bench_vmm; fi
    if part torch && [ "$have_torch" = 1 ]; then bench_torch; fi
    if part shapes && [ "$have_torch" = 1 ]; then bench_shapes; fi
    if part ghost; then bench_ghost; fi
    if part hitpath; then bench_hitpath; fi
    if part engine && [ "$have_torch" = 1 ]; then bench_engine; fi
    if part soak && [ "$have_torch" = 1 ]; then bench_soak; fi
    if part rl && [ "$have_torch" = 1 ]; then bench_rl; fi
    if part vllm-mm && [ "$have_torch" = 1 ]; then bench_vllm_mm; fi
    note "measurements took $((SECONDS - started)) s"
    if part ipc || part sglang; then
        "$PYTHON" tools/bench/plot_bench.py "$OUT" --png "$OUT/bench.png" --summary "$OUT/summary.md" ||
            FAILURES=$((FAILURES + 1))
    fi
    if part sglang-code; then report_sglang_code || FAILURES=$((FAILURES + 1)); fi
    if part engine; then report_engine || FAILURES=$((FAILURES + 1)); fi
    if part soak; then
        "$PYTHON" tools/bench/soak_gpu.py report "$RAW" | tee "$OUT/soak.md" || FAILURES=$((FAILURES + 1))
    fi
    if part rl; then report_rl || FAILURES=$((FAILURES + 1)); fi
    if part vllm-mm; then report_vllm_mm || FAILURES=$((FAILURES + 1)); fi
    if part vmm || part torch || part shapes || part ghost; then
        "$PYTHON" tools/bench/bench_vmm_report.py "$OUT" --append "$OUT/summary.md" || FAILURES=$((FAILURES + 1))
    fi
    note "results in $OUT ($FAILURES failed run(s))"
    [ "$FAILURES" -eq 0 ]
}

main
