#!/usr/bin/env bash
# tests/gpu/run.sh - real-CUDA checks of ipccache (`make test-gpu`).
#
# Needs an NVIDIA GPU; without one it says so and exits 77 (skipped).  Builds
# tests/gpu/ipc_pair.cu with nvcc (cudart static and shared), ctx_teardown.cu,
# ctx_ids.c, ghost_teardown.cu, exporter_exit.c and the VMM programs (vmm_errors.cu, vmm_rebuild.c, vmm_ghost.c) into build/gpu/, runs every program
# once without and once with the shim, and compares.  PyTorch runs twice:
# legacy IPC, and expandable segments (the VMM path).
#
# Environment:
#   IPCCACHE_LIB   the shim (default build/libipccache.so)
#   OUT_DIR        raw outputs (default build/gpu/out)
#   CUDA_HOME      default /usr/local/cuda; NVCC defaults to $CUDA_HOME/bin/nvcc
#   IPC_ITERS      importer loop count K (default 50)
#   IPC_SIZE       exported buffer size in bytes (default 64 MiB)
#   TORCH_ITERS    messages in the PyTorch check (default 50)
#   TORCH_VMM_ITERS, TORCH_VMM_POOL_MB  the expandable-segments check (200, 512)
#   TORCH_FDS_TENSORS  400 MiB tensors held at once at a soft limit of 1,024 open files (100: 2,000 chunks)
#   VMM_ITERS, VMM_CHUNKS, VMM_CHUNK_MB  vmm_rebuild's rebuilds, chunks, MiB (50, 26, 20)
#   GPU_TEST_TIMEOUT  seconds allowed per program run (default 180)
#   GHOST_SIZE     bytes the exporter frees in the ghost-memory check (default 8 GiB)
#   GHOST_TEARDOWN_SIZE  bytes the exporter's context teardown frees (default 1 GiB)
#   VMM_GHOST_CHUNKS, VMM_GHOST_CHUNK_MB  the VMM ghost-memory check's chunks, MiB (8, 256)
set -u

cd "$(dirname "$0")/../.." || exit 2

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
LIB=${IPCCACHE_LIB:-build/libipccache.so}
OUT_DIR=${OUT_DIR:-build/gpu/out}
BUILD_DIR=build/gpu
K=${IPC_ITERS:-50}
SIZE=${IPC_SIZE:-67108864}
TORCH_ITERS=${TORCH_ITERS:-50}
TORCH_VMM_ITERS=${TORCH_VMM_ITERS:-200}
TORCH_VMM_POOL_MB=${TORCH_VMM_POOL_MB:-512}
TORCH_FDS_TENSORS=${TORCH_FDS_TENSORS:-100}
VMM_ITERS=${VMM_ITERS:-50}
VMM_CHUNKS=${VMM_CHUNKS:-26}
VMM_CHUNK_MB=${VMM_CHUNK_MB:-20}
RUN_TIMEOUT=${GPU_TEST_TIMEOUT:-180}
HERE=tests/gpu
COUNTER=$BUILD_DIR/libioctl_count.so   # counts driver requests from outside the shim

PASSED=0
FAILED=0
pass() { echo "PASS $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $1${2:+: $2}"; FAILED=$((FAILED + 1)); }
# check NAME CMD...: PASS when CMD succeeds.
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name"; fi; }

gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true; }

bash tools/need_gpu.sh test-gpu || exit $?
NGPU=$(gpu_count)

if [ ! -f "$LIB" ]; then
    echo "test-gpu: $LIB not found (build it first, or set IPCCACHE_LIB)" >&2
    exit 2
fi
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")  # children may change directory
mkdir -p "$BUILD_DIR" "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
echo "test-gpu: $NGPU GPU(s); shim $LIB; outputs in $OUT_DIR"
nvidia-smi -L >"$OUT_DIR/nvidia-smi.txt" 2>&1

# sm_XY of GPU 0, plus PTX so that a newer GPU can still run the fill kernel.
gpu_arch() {
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i 0 2>/dev/null | tr -d ' .')
    case "$cc" in ''|*[!0-9]*) cc=90 ;; esac
    echo "-gencode arch=compute_$cc,code=[sm_$cc,compute_$cc]"
}

build() {
    local arch rt ok=0
    arch=$(gpu_arch)
    for rt in static shared; do
        # shellcheck disable=SC2086  # $arch is several words on purpose
        if "$NVCC" -O2 $arch -cudart "$rt" -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64" \
            -o "$BUILD_DIR/ipc_pair_$rt" "$HERE/ipc_pair.cu" >"$OUT_DIR/build_$rt.log" 2>&1; then
            pass "build_ipc_pair_$rt"
        else
            fail "build_ipc_pair_$rt" "see $OUT_DIR/build_$rt.log"
            ok=1
        fi
    done
    if ${CC:-cc} -O2 -fPIC -shared -o "$COUNTER" "$HERE/ioctl_count.c" -ldl \
        >"$OUT_DIR/build_ioctl_count.log" 2>&1; then
        pass "build_ioctl_count"
    else
        fail "build_ioctl_count" "see $OUT_DIR/build_ioctl_count.log"
        ok=1
    fi
    local prog src
    for src in ctx_teardown.cu ctx_ids.c ghost_teardown.cu exporter_exit.c vmm_errors.cu vmm_rebuild.c vmm_ghost.c; do
        prog=${src%.*}
        # shellcheck disable=SC2086  # $arch is several words on purpose
        if "$NVCC" -O2 $arch -o "$BUILD_DIR/$prog" "$HERE/$src" \
            -L"$CUDA_HOME/lib64/stubs" -lcuda -ldl >"$OUT_DIR/build_$prog.log" 2>&1; then
            pass "build_$prog"
        else
            fail "build_$prog" "see $OUT_DIR/build_$prog.log"
            ok=1
        fi
    done
    return $ok
}

# run_plain OUTFILE CMD...: without the shim (and without any inherited preload
# but the ioctl counter).
run_plain() {
    local out=$1; shift
    timeout "$RUN_TIMEOUT" env LD_PRELOAD="$COUNTER" "$@" >"$out" 2>"$out.err"
}

# run_shim OUTFILE STATSDIR CMD...: the shim preloaded into every process of CMD;
# each process writes its stats at exit to STATSDIR/stats.<pid>.
run_shim() {
    local out=$1 stats=$2; shift 2
    rm -rf "$stats"; mkdir -p "$stats"
    # timeout stays outside the preload so that only the programs get the shim.
    timeout "$RUN_TIMEOUT" env -u IPCCACHE_DISABLE LD_PRELOAD="$LIB:$COUNTER" IPCCACHE_STATS_AT_EXIT=1 \
        IPCCACHE_STATS_FILE="$stats/stats.%p" "$@" >"$out" 2>"$out.err"
}

# value KEY FILE: the value of the first "KEY=value" token in FILE.
value() { grep -o "\(^\| \)$1=[^ ]*" "$2" | head -n1 | sed 's/.*=//'; }

# pid_of PHASE FILE: the importer pid of that phase.
pid_of() { grep -o "role=importer phase=$1 pid=[0-9]*" "$2" | head -n1 | sed 's/.*pid=//'; }

# stats_of STATSDIR PID: the stats file of that process.
stats_of() { echo "$1/stats.$2"; }

same_codes() {
    # Both runs must print the same set of cases with the same codes; an empty
    # set means the program broke before the error cases.
    local a b
    a=$(grep '^case=' "$1" | sort)
    b=$(grep '^case=' "$2" | sort)
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        diff <(echo "$a") <(echo "$b") | sed 's/^/    /'
        return 1
    fi
}

# ipc_pair_suite VARIANT TAG ARGS...: one binary, one device placement.
ipc_pair_suite() {
    local variant=$1 tag=$2; shift 2
    local bin=$BUILD_DIR/ipc_pair_$variant
    local off=$OUT_DIR/${tag}_off.txt on=$OUT_DIR/${tag}_on.txt sdir=$OUT_DIR/${tag}_stats
    local rc_off=0 rc_on=0
    run_plain "$off" "$bin" export --size "$SIZE" --iters "$K" "$@" || rc_off=$?
    run_shim "$on" "$sdir" "$bin" export --size "$SIZE" --iters "$K" "$@" || rc_on=$?

    check "${tag}_no_shim_pattern" test "$(value pattern_ok "$off")" = 1 -a "$rc_off" = 0
    check "${tag}_shim_pattern" test "$(value pattern_ok "$on")" = 1 -a "$rc_on" = 0
    check "${tag}_error_codes_match" same_codes "$off" "$on"
    # With the shim every open in the loop returns the cached mapping.
    check "${tag}_shim_same_ptr" test "$(value loop_same_ptr "$on")" = 1
    # Seen from outside the shim: opens and closes after the first ask the
    # kernel driver for nothing, where without the shim each one maps/unmaps.
    local io_off io_on
    io_off=$(value loop_later_ioctls "$off") io_on=$(value loop_later_ioctls "$on")
    echo "    ioctls in opens+closes 2..K: without shim ${io_off:-?}, with shim ${io_on:-?}"
    check "${tag}_driver_requests_counted" test "${io_off:-0}" -gt 0
    check "${tag}_shim_spares_driver_requests" test "${io_on:-1}" -le "$(( ${io_off:-0} / 10 ))"

    # Loop importer (exact): K opens of one handle, all successful -> one real
    # open (the first, a miss) and K-1 hits; K closes, each keeping the mapping
    # cached; no errors.  That process makes no other IPC call, so this is
    # independent of how the shim counts failed calls.
    local lp
    lp=$(pid_of loop "$on")
    check "${tag}_shim_loop_stats" python3 "$HERE/stats_check.py" "$(stats_of "$sdir" "${lp:-none}")" \
        "opens==$K" "hits==$((K - 1))" "misses==1" "real_opens==1" "closes==$K" "errors==0" "evictions==0"

    # Errors importer (exact where the driver decides): a close past zero
    # (double_close, nested_close_extra) gives the cache's own reference back
    # and lets the driver answer, as without the cache, so the next open maps
    # again. Valid opens: first_open, reopen and final_open are misses;
    # open_for_interior and nested_open_a/b are hits. Failed opens (flags 0,
    # zero handle) go to the driver too.
    local ep
    ep=$(pid_of errors "$on")
    check "${tag}_shim_errors_stats" python3 "$HERE/stats_check.py" "$(stats_of "$sdir" "${ep:-none}")" \
        "hits==3" "real_opens==3" "real_closes==2"
}

# A reset primary context and a destroyed-then-recreated context must each
# map the handle again (never return the dead mapping) and read the right data.
teardown_suite() {
    local off=$OUT_DIR/teardown_off.txt on=$OUT_DIR/teardown_on.txt sdir=$OUT_DIR/teardown_stats
    local rc_off=0 rc_on=0 ip
    run_plain "$off" "$BUILD_DIR/ctx_teardown" || rc_off=$?
    run_shim "$on" "$sdir" "$BUILD_DIR/ctx_teardown" || rc_on=$?
    check teardown_no_shim_values test "$(value import_ok "$off")" = 1 -a "$rc_off" = 0
    check teardown_shim_values test "$(value import_ok "$on")" = 1 -a "$rc_on" = 0
    ip=$(value pid "$on")
    # primary_first miss, primary_again hit, then three new contexts: three misses.
    check teardown_shim_stats python3 "$HERE/stats_check.py" "$(stats_of "$sdir" "${ip:-none}")" \
        "real_opens==4" "hits==1" "invalidations>=2" "errors==0"
}

# What the driver answers about dead contexts (ctx_ids.c), without the shim:
# the facts the context ids rest on must hold; the rest is printed, for the
# stand-in to mimic (tests/standin/fake_cuda.c).
ctx_ids_suite() {
    local out=$OUT_DIR/ctx_ids.txt rc=0
    run_plain "$out" "$BUILD_DIR/ctx_ids" || rc=$?
    tr '\n' ' ' <"$out" | fold -s -w 110 | sed 's/^/    /'
    echo
    check ctx_ids_facts test "$(value facts_ok "$out")" = 1 -a "$rc" = 0
}

# stat_value KEY FILE: KEY's value in the last stats line of FILE; -1 when absent.
stat_value() {
    python3 - "$1" "$2" <<'PY' 2>/dev/null || echo -1
import json, sys
lines = [l for l in open(sys.argv[2]).read().splitlines() if l.strip()]
print(int(json.loads(lines[-1])[sys.argv[1]]))
PY
}

# ---- the VMM path (PyTorch's expandable segments) ----------------------------

# vmm_errors.cu: every return code the same without and with the shim, except
# the same_handle detail (repeated imports return one handle with the shim).
vmm_errors_suite() {
    local off=$OUT_DIR/vmm_errors_off.txt on=$OUT_DIR/vmm_errors_on.txt
    local a b
    run_plain "$off" "$BUILD_DIR/vmm_errors"
    run_shim "$on" "$OUT_DIR/vmm_errors_stats" "$BUILD_DIR/vmm_errors"
    a=$(grep '^case=' "$off" | sed 's/ detail=same_handle=[01]//')
    b=$(grep '^case=' "$on" | sed 's/ detail=same_handle=[01]//')
    check vmm_errors_ran test -n "$a"
    if [ -n "$a" ] && [ "$a" = "$b" ]; then
        pass vmm_errors_codes_match
    else
        fail vmm_errors_codes_match "$(diff <(echo "$a") <(echo "$b") | head -n 20 | tr '\n' ' ')"
    fi
}

# vmm_rebuild_suite TAG IMPORTER_GPU: VMM_ITERS rebuilds of one exporter's
# segment, as c10's ExpandableSegment::fromShared does it. Exact stats: one
# real import and map per chunk, every later rebuild all hits with its
# set-access skipped; the latest data read every time; and, seen from outside
# the shim, later rebuilds spare the kernel driver's requests.
vmm_rebuild_suite() {
    local tag=$1 gpu=$2
    local off=$OUT_DIR/${tag}_off.txt on=$OUT_DIR/${tag}_on.txt sdir=$OUT_DIR/${tag}_stats
    local args=("$VMM_ITERS" "$VMM_CHUNKS" "$VMM_CHUNK_MB" "$gpu")
    local n=$((VMM_ITERS * VMM_CHUNKS)) later=$(((VMM_ITERS - 1) * VMM_CHUNKS)) ip io_off io_on
    run_plain "$off" "$BUILD_DIR/vmm_rebuild" "${args[@]}"
    run_shim "$on" "$sdir" "$BUILD_DIR/vmm_rebuild" "${args[@]}"
    check "${tag}_no_shim_data" grep -q '^check=ok' "$off"
    check "${tag}_shim_latest_data" grep -q '^check=ok' "$on"
    grep -h median_us "$off" "$on" | sed 's/^/    /'
    ip=$(value importer_pid "$on")
    check "${tag}_shim_stats" python3 "$HERE/stats_check.py" "$(stats_of "$sdir" "${ip:-none}")" \
        "vmm_imports==$n" "vmm_import_hits==$later" "vmm_maps==$n" "vmm_map_hits==$later" \
        "vmm_access_skips==$((VMM_ITERS - 1))" "errors==0"
    io_off=$(value loop_later_ioctls "$off") io_on=$(value loop_later_ioctls "$on")
    echo "    ioctls in the VMM calls of rebuilds 2..K: without shim ${io_off:-?}, with shim ${io_on:-?}"
    check "${tag}_driver_requests_counted" test "${io_off:-0}" -gt 0
    check "${tag}_shim_spares_driver_requests" test "${io_on:-1}" -le "$(( ${io_off:-0} / 10 ))"
}

torch_ready() {
    python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

torch_suite() {
    local off=$OUT_DIR/torch_off.txt on=$OUT_DIR/torch_on.txt sdir=$OUT_DIR/torch_stats
    local rc_off=0 rc_on=0 cp
    local cmd=(env -u PYTORCH_CUDA_ALLOC_CONF python3 "$HERE/torch_consumer.py" --iters "$TORCH_ITERS")
    run_plain "$off" "${cmd[@]}" || rc_off=$?
    # The preload covers the whole python command: producer and spawned consumer.
    run_shim "$on" "$sdir" "${cmd[@]}" || rc_on=$?
    check torch_no_shim_values test "$(value values_ok "$off")" = 1 -a "$rc_off" = 0
    check torch_shim_values test "$(value values_ok "$on")" = 1 -a "$rc_on" = 0
    # Every message carries the pool's one handle: one real open, the rest hits.
    cp=$(value consumer_pid "$on")
    check torch_shim_consumer_stats python3 "$HERE/stats_check.py" "$(stats_of "$sdir" "${cp:-none}")" \
        "real_opens==1" "hits>=$((TORCH_ITERS - 1))" "errors==0"
}

# Issue 17's one-tensor-at-a-time weight sync under expandable segments
# (tools/bench/bench_torch_vmm.py --shapes one --quick: 26 tensors, 11 steps, A/B/A):
# the engine's values right in every phase, and with the cache at least 80%
# of its maps hits (the first step is all real, later ones should be all hits).
torch_shapes_suite() {
    local out=$OUT_DIR/torch_shapes.json log=$OUT_DIR/torch_shapes.txt rc=0
    timeout "$RUN_TIMEOUT" env -u LD_PRELOAD python3 "$HERE/../../tools/bench/bench_torch_vmm.py" --alloc expandable \
        --shim "$LIB" --shapes one --quick --stats-dir "$OUT_DIR/torch_shapes_stats" \
        --out "$out" >"$log" 2>&1 || rc=$?
    sed 's/^/    /' "$log" | grep 'shape=' || true
    check torch_shapes_one_values test "$rc" = 0
    check torch_shapes_one_map_hits python3 -c '
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["shapes"] if r["cache"] == "on"]
sys.exit(not rows or any(r["vmm_maps"] == 0 or r["vmm_map_hits"] * 100 < 80 * r["vmm_maps"] for r in rows))
' "$out"
}

# PyTorch with expandable_segments:True: the producer's pool is an expandable
# segment, and every message makes the consumer rebuild it (import per chunk,
# reserve, map per chunk, set-access) and release it. The consumer must read
# the value just written (through the cached mapping, with the shim), import
# each chunk for real once, and map nearly every time from what it kept.
torch_vmm_suite() {
    local off=$OUT_DIR/torch_vmm_off.txt on=$OUT_DIR/torch_vmm_on.txt sdir=$OUT_DIR/torch_vmm_stats
    local rc_off=0 rc_on=0 cp f imports hits maps map_hits chunks
    local cmd=(env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$HERE/torch_consumer.py"
               --iters "$TORCH_VMM_ITERS" --pool-mb "$TORCH_VMM_POOL_MB" "$@")
    local tag=torch_vmm${1:+_xdev}
    run_plain "$off" "${cmd[@]}" || rc_off=$?
    run_shim "$on" "$sdir" "${cmd[@]}" || rc_on=$?
    check "${tag}_no_shim_values" test "$(value values_ok "$off")" = 1 -a "$rc_off" = 0
    check "${tag}_shim_values" test "$(value values_ok "$on")" = 1 -a "$rc_on" = 0
    cp=$(value consumer_pid "$on")
    f=$(stats_of "$sdir" "${cp:-none}")
    imports=$(stat_value vmm_imports "$f") hits=$(stat_value vmm_import_hits "$f")
    maps=$(stat_value vmm_maps "$f") map_hits=$(stat_value vmm_map_hits "$f")
    chunks=$((imports > 0 ? imports / TORCH_VMM_ITERS : 0))
    echo "    consumer: $imports imports, $hits hits; $maps maps, $map_hits hits; $chunks chunks a rebuild"
    check "${tag}_shim_rebuilds_whole_segments" test "$chunks" -gt 0 -a $((imports % TORCH_VMM_ITERS)) = 0
    check "${tag}_shim_one_real_import_per_chunk" test "$chunks" -gt 0 -a $((imports - hits)) = "$chunks"
    # torch may free a rebuilt segment late, so that the next rebuild maps a
    # second copy for real: nearly all, not all, maps are hits.
    check "${tag}_shim_maps_hit" test $((map_hits * 10)) -ge $((maps * 9)) -a "$maps" -gt 0
    check "${tag}_shim_no_errors" python3 "$HERE/stats_check.py" "$f" "errors==0"
}

# fds_within_bound OFF ON: the consumer's fds with the shim exceed those without
# by at most an eighth of its soft limit of 1,024 (what the cache may keep), plus slack.
fds_within_bound() {
    [[ $1 =~ ^[0-9]+$ && $2 =~ ^[0-9]+$ ]] && [ "$2" -le $(($1 + 1024 / 8 + 8)) ]
}

# A consumer at a soft limit of 1,024 open files holding 2,000 chunks of an
# expandable segment live (100 tensors of 400 MiB, 40 GiB; tests/gpu/torch_fds.py):
# every value right and the program's 50 opens succeed, without and with the
# shim; with it the consumer keeps at most an eighth of its limit as kept fds
# (docs/limits.md), and the imports past that go uncached.
torch_fds_suite() {
    local off=$OUT_DIR/torch_fds_off.txt on=$OUT_DIR/torch_fds_on.txt sdir=$OUT_DIR/torch_fds_stats
    local rc_off=0 rc_on=0 a b cp f
    local cmd=(env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$HERE/torch_fds.py"
               --tensors "$TORCH_FDS_TENSORS" --tensor-mb 400 --nofile 1024)
    run_plain "$off" "${cmd[@]}" || rc_off=$?
    run_shim "$on" "$sdir" "${cmd[@]}" || rc_on=$?
    check torch_fds_no_shim_values test "$(value values_ok "$off")" = 1 -a "$rc_off" = 0
    check torch_fds_no_shim_opens test "$(value opens_ok "$off")" = 1
    check torch_fds_shim_values test "$(value values_ok "$on")" = 1 -a "$rc_on" = 0
    check torch_fds_shim_opens test "$(value opens_ok "$on")" = 1
    a=$(value fds_open "$off") b=$(value fds_open "$on")
    echo "    consumer's open fds holding the share: without shim ${a:-?}, with shim ${b:-?}"
    check torch_fds_shim_fds_bounded fds_within_bound "$a" "$b"
    cp=$(value consumer_pid "$on")
    f=$(stats_of "$sdir" "${cp:-none}")
    echo "    consumer: $(stat_value vmm_imports "$f") imports, $(stat_value vmm_import_hits "$f") hits"
    check torch_fds_shim_imports python3 "$HERE/stats_check.py" "$f" \
        "vmm_imports>=$((TORCH_FDS_TENSORS * 20))" "errors==0"
    if [ "$rc_off" != 0 ] || [ "$rc_on" != 0 ]; then
        echo "    exit codes: without shim $rc_off, with shim $rc_on; stderr:"
        tail -n 20 "$off.err" "$on.err" | sed 's/^/    /'
    fi
}

# An exporter's free gives its memory back although the importer cached an
# idle mapping of it: ghost_free.cu (both cudarts' driver path) and PyTorch.
ghost_suite() {
    local bin=$BUILD_DIR/ghost_free placements="0:0" pl tag off on sdir ip
    # shellcheck disable=SC2046  # gpu_arch is several words on purpose
    if ! "$NVCC" -O2 $(gpu_arch) -o "$bin" "$HERE/ghost_free.cu" >"$OUT_DIR/build_ghost.log" 2>&1; then
        fail build_ghost_free "see $OUT_DIR/build_ghost.log"
        return
    fi
    [ "$NGPU" -ge 2 ] && placements="0:0 0:1"
    for pl in $placements; do
        tag=ghost_${pl/:/_}
        off=$OUT_DIR/${tag}_off.txt on=$OUT_DIR/${tag}_on.txt sdir=$OUT_DIR/${tag}_stats
        run_plain "$off" "$bin" --size "${GHOST_SIZE:-8589934592}" \
            --export-device "${pl%:*}" --import-device "${pl#*:}"
        run_shim "$on" "$sdir" "$bin" --size "${GHOST_SIZE:-8589934592}" \
            --export-device "${pl%:*}" --import-device "${pl#*:}"
        check "${tag}_no_shim_freed" test "$(value ok "$off")" = 1
        check "${tag}_shim_freed" test "$(value ok "$on")" = 1
        ip=$(value importer_pid "$on")
        check "${tag}_shim_importer_released" python3 "$HERE/stats_check.py" \
            "$(stats_of "$sdir" "${ip:-none}")" "releases_on_request==1" "ghost_bytes==0"
    done
    if torch_ready; then
        run_plain "$OUT_DIR/torch_ghost_off.txt" python3 "$HERE/torch_ghost.py"
        run_shim "$OUT_DIR/torch_ghost_on.txt" "$OUT_DIR/torch_ghost_stats" python3 "$HERE/torch_ghost.py"
        check torch_ghost_no_shim_freed test "$(value ok "$OUT_DIR/torch_ghost_off.txt")" = 1
        check torch_ghost_shim_freed test "$(value ok "$OUT_DIR/torch_ghost_on.txt")" = 1
    fi
}

# within A B SLACK: A and B are integers at most SLACK apart.
within() {
    [[ $1 =~ ^-?[0-9]+$ && $2 =~ ^-?[0-9]+$ ]] || return 1
    [ $(($1 > $2 ? $1 - $2 : $2 - $1)) -le "$3" ]
}

# The exporter's context teardown (ghost_teardown.cu), each way: with the
# importer keeping an idle cached mapping of the 1 GiB it exported, the
# teardown gives GPU 0's memory back as without the shim, within 64 MiB; and
# the importer let go on request, not at its exit.
ghost_teardown_suite() {
    local way tag off on sdir a b ip
    for way in reset release destroy; do
        tag=ghost_teardown_$way
        off=$OUT_DIR/${tag}_off.txt on=$OUT_DIR/${tag}_on.txt sdir=$OUT_DIR/${tag}_stats
        run_plain "$off" "$BUILD_DIR/ghost_teardown" --way "$way" --size "${GHOST_TEARDOWN_SIZE:-1073741824}"
        run_shim "$on" "$sdir" "$BUILD_DIR/ghost_teardown" --way "$way" \
            --size "${GHOST_TEARDOWN_SIZE:-1073741824}"
        check "${tag}_no_shim_freed" test "$(value ok "$off")" = 1
        check "${tag}_shim_freed" test "$(value ok "$on")" = 1
        a=$(value given_back "$off") b=$(value given_back "$on")
        echo "    bytes the teardown gave back: without shim ${a:-?}, with shim ${b:-?}"
        check "${tag}_shim_gives_back_as_without" within "$a" "$b" $((64 << 20))
        ip=$(value importer_pid "$on")
        check "${tag}_shim_importer_let_go_on_request" python3 "$HERE/stats_check.py" \
            "$(stats_of "$sdir" "${ip:-none}")" "releases_on_request==1" "ghost_bytes==0" "errors==0"
    done
}

# An exited exporter's handle opened (exporter_exit.c): the driver's answer
# in each case (printed: a fact the stand-in must mimic), and the library's
# the same in each.
exporter_exit_suite() {
    local off=$OUT_DIR/exporter_exit_off.txt on=$OUT_DIR/exporter_exit_on.txt
    local sdir=$OUT_DIR/exporter_exit_stats c a b
    run_plain "$off" "$BUILD_DIR/exporter_exit"
    run_shim "$on" "$sdir" "$BUILD_DIR/exporter_exit"
    for c in unheld_zombie unheld_reaped held_before other_after same_held_after same_reopen_after; do
        a=$(grep "^case=$c " "$off" | sed 's/^case=[^ ]* //') b=$(grep "^case=$c " "$on" | sed 's/^case=[^ ]* //')
        echo "    $c: without shim ${a:-?}; with shim ${b:-?}"
        check "exporter_exit_${c}_as_without" test -n "$a" -a "$a" = "$b"
    done
}

# The same on the VMM path (vmm_ghost.c): the exporter's cuMemRelease of
# chunks it exported, which the importer rebuilt and dropped (with the shim:
# cached, idle, the importer still alive), gives GPU 0's memory back as
# without the shim, within 64 MiB; and the importer let go on request, not
# at its exit.
vmm_ghost_suite() {
    local gpus=0 gpu tag off on sdir rc_off rc_on a b ip f
    local args=("${VMM_GHOST_CHUNKS:-8}" "${VMM_GHOST_CHUNK_MB:-256}")
    if [ "$NGPU" -ge 2 ]; then gpus="0 1"; else echo "SKIP cross-device vmm_ghost (one GPU)"; fi
    for gpu in $gpus; do
        tag=vmm_ghost_0_$gpu rc_off=0 rc_on=0
        off=$OUT_DIR/${tag}_off.txt on=$OUT_DIR/${tag}_on.txt sdir=$OUT_DIR/${tag}_stats
        run_plain "$off" "$BUILD_DIR/vmm_ghost" "$gpu" "${args[@]}" || rc_off=$?
        run_shim "$on" "$sdir" "$BUILD_DIR/vmm_ghost" "$gpu" "${args[@]}" || rc_on=$?
        check "${tag}_no_shim_read" test "$(value read_ok "$off")" = 1 -a "$(value importer_exit "$off")" = 0
        check "${tag}_no_shim_released" test "$(value released_ok "$off")" = 1
        check "${tag}_shim_read" test "$(value read_ok "$on")" = 1 -a "$(value importer_exit "$on")" = 0
        check "${tag}_shim_released" test "$(value released_ok "$on")" = 1
        a=$(value given_back "$off") b=$(value given_back "$on")
        echo "    bytes the release gave back: without shim ${a:-?}, with shim ${b:-?}"
        check "${tag}_shim_gives_back_as_without" within "$a" "$b" $((64 << 20))
        ip=$(value importer_pid "$on")
        f=$(stats_of "$sdir" "${ip:-none}")
        echo "    importer: releases_on_request $(stat_value releases_on_request "$f")," \
            "ghost_bytes $(stat_value ghost_bytes "$f"), vmm_idle_bytes $(stat_value vmm_idle_bytes "$f")"
        check "${tag}_shim_importer_let_go_on_request" python3 "$HERE/stats_check.py" "$f" \
            "releases_on_request>0" "ghost_bytes==0" "errors==0"
        if [ "$rc_off" != 0 ] || [ "$rc_on" != 0 ]; then
            echo "    exit codes: without shim $rc_off, with shim $rc_on; stderr:"
            head -n 20 "$off.err" "$on.err" | sed 's/^/    /'
        fi
    done
}

main() {
    build || { echo "test-gpu: $PASSED passed, $FAILED failed"; exit 1; }
    local rt
    for rt in static shared; do
        ipc_pair_suite "$rt" "ipc_pair_$rt"
    done
    if [ "$NGPU" -ge 2 ]; then
        # Export on GPU 0, import on GPU 1: the mapping goes through peer access.
        for rt in static shared; do
            ipc_pair_suite "$rt" "ipc_pair_${rt}_xdev" --export-device 0 --device 1
        done
    else
        echo "SKIP cross-device ipc_pair (one GPU)"
    fi
    teardown_suite
    ctx_ids_suite
    vmm_errors_suite
    vmm_rebuild_suite vmm_rebuild 0
    if [ "$NGPU" -ge 2 ]; then
        # Exporter on GPU 0, importer on GPU 1: set-access costs the most there.
        vmm_rebuild_suite vmm_rebuild_xdev 1
    else
        echo "SKIP cross-device vmm_rebuild (one GPU)"
    fi
    ghost_suite
    ghost_teardown_suite
    exporter_exit_suite
    vmm_ghost_suite
    if torch_ready; then
        torch_suite
        torch_vmm_suite
        torch_fds_suite
        torch_shapes_suite
        if [ "$NGPU" -ge 2 ]; then
            torch_vmm_suite --device-consumer 1
        fi
    else
        echo "SKIP torch_consumer (python3 with CUDA-enabled torch not found)"
    fi
    echo "test-gpu: $PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ]
}

main
