#!/usr/bin/env bash
# tools/peer_suites.sh - `make peer`: other projects' own CUDA IPC tests, run
# once without and once with libipccache.so preloaded, compared test by test.
#
# Suites:
#   pytorch             PyTorch's test/test_multiprocessing.py, the tests whose
#                       names contain cuda, event or leaf_variable_sharing (all
#                       that touch CUDA); test_cuda_send_many is @slowTest and
#                       stays skipped unless PYTORCH_TEST_WITH_SLOW=1 (100000
#                       tensors: far too long for this comparison).
#   pytorch-expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#                       (the other suite runs with PYTORCH_CUDA_ALLOC_CONF unset).
#   numba-cuda          numba's IPC tests, numba.cuda.tests.cudapy.test_ipc,
#                       which ship inside the installed package.
#   sglang              SGLang's own transport (not in the default set: it needs
#                       `make peer-fetch` first, which puts PEER_DIR/sglang/ in
#                       place): sglang-unit, its unit test
#                       test/registered/unit/multimodal/test_cuda_ipc_transport.py;
#                       sglang-driver, tools/sglang_peer/driver.py driving its
#                       MmItemMemoryPool and CudaIpcTensorTransportProxy (legacy
#                       and expandable segments, SGLang's cache off and on), whose
#                       per-feature medians and the consumer's hits are printed.
#                       Either part alone: PEER_SUITES=sglang-unit or sglang-driver.
#                       A missing or changed fetched file stops the run (status 2).
#   rl                  vLLM's, verl's and OpenRLHF's own weight-sync code (not in the
#                       default set: it needs `make peer-fetch`, which puts PEER_DIR/rl/
#                       in place), driven by tools/bench/rl/rl_bench.py with a few
#                       syncs per case: each case x allocator x engine state is a
#                       test that passes when every received weight is the
#                       trainer's. None of the three releases ships a test of this
#                       code (vLLM's wheel ships no tests; verl's and OpenRLHF's
#                       tests/ hold none of it), so this is the comparison.
#                       A missing or changed fetched file stops the run (status 2).
# PyTorch's wheels do not ship their tests: put a copy of test/test_multiprocessing.py,
# best from the installed release's tag, in PEER_DIR; it is other people's code,
# keep it out of this repository (.peer/ is the default because it can be ignored).
#
# The run without has LD_PRELOAD unset; the run with has LD_PRELOAD set to the
# shim alone, IPCCACHE_STATS_AT_EXIT=1 and the stats files in its own folder.
# Other IPCCACHE_* settings of the caller apply to it unchanged.
#
# Each run records every test's outcome as it finishes (tools/peer_record.py),
# so a run that hangs or crashes still reports what it did. Per suite this
# prints one row per test (id, outcome without, outcome with) and the line
# "peer: SUITE: N same, M differ".
#
# usage: tools/peer_suites.sh [PEER_DIR]        (default .peer)
# Environment:
#   IPCCACHE_LIB  the shim (default build/libipccache.so)
#   OUT_DIR       results (default build/peer): OUT_DIR/SUITE/{without,with}/ hold
#                 log.txt, results.tsv, junit.xml (pytest), stats/ (ipccache, at exit)
#   PEER_SUITES   which suites (default "pytorch pytorch-expandable numba-cuda")
#   PEER_RUNNER   pytest or unittest (default pytest when importable)
#   PEER_TIMEOUT  seconds allowed per run (default 300)
#   PYTHON        default python3
# Exit status: 0 every outcome the same, 1 an outcome differs or a suite
# reported nothing, 2 a setup error, 77 no GPU (skipped).
set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2

PEER_DIR=${1:-.peer}
LIB=${IPCCACHE_LIB:-build/libipccache.so}
OUT_DIR=${OUT_DIR:-build/peer}
SUITES=${PEER_SUITES:-pytorch pytorch-expandable numba-cuda}
RUN_TIMEOUT=${PEER_TIMEOUT:-300}
PYTHON=${PYTHON:-python3}
TOOLS=$(pwd)/tools
TORCH_FILE=test_multiprocessing.py
TORCH_WORDS=(cuda event leaf_variable_sharing)
NUMBA_MODULES=(numba.cuda.tests.cudapy.test_ipc numba_cuda.numba.cuda.tests.cudapy.test_ipc)
RECORD=("$PYTHON" "$TOOLS/peer_record.py")
# The recorder is a plugin; the junit file is for other tools, @RUN@ is the run's folder.
PYTEST_ENV=("PYTHONPATH=$TOOLS${PYTHONPATH:+:$PYTHONPATH}")
# No configuration file is looked for: one in a folder above must not change the run.
PYTEST=("$PYTHON" -m pytest -c /dev/null --rootdir=@RUN@ -p peer_record -p no:cacheprovider
        -rA -v --junitxml=@RUN@/junit.xml)

note() { echo "peer: $*"; }

# imports NAME MODULE [WHY]: 0 if MODULE imports; else says that suite NAME is
# skipped, with the import error, and returns 1 (both runs would fail alike,
# reporting nothing).
imports() {
    local err
    err=$("$PYTHON" -c "import $2" 2>&1) && return 0
    note "$1: skipped: $2 does not import${3:+ ($3)}:"
    note "  $(tail -n 1 <<<"$err")"
    return 1
}

# run_one DIR PRELOAD(0|1) CMD...: one run of a suite, outcomes in DIR/results.tsv;
# @RUN@ in CMD becomes DIR.
run_one() {
    local dir=$1 preload=$2 rc
    shift 2
    local -a cmd=("${@//@RUN@/$dir}")
    rm -rf "$dir"
    mkdir -p "$dir/stats"
    local -a env_args=(-u LD_PRELOAD "PEER_RECORD=$dir/results.tsv")
    if [ "$preload" = 1 ]; then
        env_args=("LD_PRELOAD=$LIB" "PEER_RECORD=$dir/results.tsv" IPCCACHE_STATS_AT_EXIT=1
                  "IPCCACHE_STATS_FILE=$dir/stats/ipccache-%p.json" "IPCCACHE_STATS_DIR=$dir/stats")
    fi
    : >"$dir/results.tsv"
    # timeout signals its whole process group: spawned workers are stopped too.
    timeout -k 30 "$RUN_TIMEOUT" env "${env_args[@]}" "${cmd[@]}" >"$dir/log.txt" 2>&1
    rc=$?
    echo "$rc" >"$dir/rc"
    case $rc in
        124|137) note "  $(basename "$dir"): timed out after ${RUN_TIMEOUT}s ($dir/log.txt)" ;;
        *) note "  $(basename "$dir"): exit status $rc" ;;
    esac
}

# compare_suite NAME: print the table and the summary line, count differences.
compare_suite() {
    local name=$1 dir=$OUT_DIR/$1
    "${RECORD[@]}" compare "$name" "$dir/without/results.tsv" "$dir/with/results.tsv" \
        | tee "$dir/compare.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || DIFFERING=$((DIFFERING + 1))
    note "  ipccache stats (with): $("${RECORD[@]}" stats "$dir/with/stats")"
}

# run_suite NAME ENV... -- CMD...: both runs of one suite, then the comparison.
run_suite() {
    local name=$1 dir=$OUT_DIR/$1
    local -a extra=()
    shift
    while [ "$1" != -- ]; do extra+=("$1"); shift; done
    shift
    note "$name: $(printf '%q ' "$@")"
    run_one "$dir/without" 0 env "${extra[@]}" "$@"
    run_one "$dir/with" 1 env "${extra[@]}" "$@"
    compare_suite "$name"
}

run_torch() {
    local name=$1 alloc=$2 file=$PEER_DIR/$TORCH_FILE
    local -a alloc_env=(-u PYTORCH_CUDA_ALLOC_CONF)
    [ -n "$alloc" ] && alloc_env=("PYTORCH_CUDA_ALLOC_CONF=$alloc")
    if [ -z "$TORCH_VERSION" ]; then
        note "$name: skipped: $PYTHON cannot import torch with CUDA"
        return
    fi
    if [ ! -f "$file" ]; then
        note "$name: skipped: no $file (copy test/$TORCH_FILE from PyTorch $TORCH_VERSION there)"
        return
    fi
    imports "$name" torch.testing._internal.common_utils "it needs expecttest" || return
    if [ "$RUNNER" = pytest ]; then
        local expr
        expr=$(printf ' or %s' "${TORCH_WORDS[@]}")
        run_suite "$name" "${alloc_env[@]}" "${PYTEST_ENV[@]}" -- "${PYTEST[@]}" -k "${expr# or }" "$file"
    else
        run_suite "$name" "${alloc_env[@]}" -- "${RECORD[@]}" unittest "$file" "${TORCH_WORDS[@]}"
    fi
}

# The fetched SGLang, unpacked under OUT_DIR; its stand-ins (tools/sglang_peer/site)
# load in every interpreter of the run, spawned children included.
SGLANG_READY=
prepare_sglang() {
    [ -n "$SGLANG_READY" ] && return 0
    SGLANG_TREE=$OUT_DIR/sglang-tree
    "$PYTHON" "$TOOLS/sglang_peer/prepare.py" "$PEER_DIR/sglang" "$SGLANG_TREE" || exit 2
    SGLANG_ENV=("PYTHONPATH=$SGLANG_TREE/src:$TOOLS/sglang_peer/site${PYTHONPATH:+:$PYTHONPATH}"
                "SGLANG_PEER_DEPS=$SGLANG_TREE/deps")
    SGLANG_READY=1
    note "sglang: $(cat "$PEER_DIR/sglang/VERSION") from $PEER_DIR/sglang"
}

run_sglang_unit() {
    [ -n "$TORCH_VERSION" ] || { note "sglang-unit: skipped: $PYTHON cannot import torch with CUDA"; return; }
    prepare_sglang
    run_suite sglang-unit -u PYTORCH_CUDA_ALLOC_CONF "${SGLANG_ENV[@]}" -- \
        "${RECORD[@]}" unittest "$SGLANG_TREE/test_cuda_ipc_transport.py"
}

run_sglang_driver() {
    local run
    [ -n "$TORCH_VERSION" ] || { note "sglang-driver: skipped: $PYTHON cannot import torch with CUDA"; return; }
    prepare_sglang
    run_suite sglang-driver -u PYTORCH_CUDA_ALLOC_CONF "${SGLANG_ENV[@]}" SGLANG_PEER_STUB_TRANSFORMERS=1 -- \
        "$PYTHON" "$TOOLS/sglang_peer/driver.py" run --out @RUN@/driver.json
    for run in without with; do
        sed -n "s/^sglang-driver: \(.*\)/peer:   $run: \1/p" "$OUT_DIR/sglang-driver/$run/log.txt"
        # A wrong value is a failure even when both runs agree on it.
        if [ "$(cat "$OUT_DIR/sglang-driver/$run/rc")" != 0 ]; then
            note "  sglang-driver: the run $run failed ($OUT_DIR/sglang-driver/$run/log.txt)"
            DIFFERING=$((DIFFERING + 1))
        fi
    done
    "$PYTHON" "$TOOLS/sglang_peer/driver.py" report "$OUT_DIR/sglang-driver/without/driver.json" \
        "$OUT_DIR/sglang-driver/with/driver.json" >"$OUT_DIR/sglang-driver/table.md" 2>/dev/null &&
        sed 's/^/peer:   /' "$OUT_DIR/sglang-driver/table.md"
}

run_rl() {
    local tree=$OUT_DIR/rl-tree
    [ -n "$TORCH_VERSION" ] || { note "rl: skipped: $PYTHON cannot import torch with CUDA"; return; }
    "$PYTHON" "$TOOLS/rl_peer/prepare.py" "$PEER_DIR/rl" "$tree" || exit 2
    note "rl: $(tr '\n' ' ' <"$PEER_DIR/rl/VERSIONS")from $PEER_DIR/rl"
    run_suite rl -u PYTORCH_CUDA_ALLOC_CONF "PYTHONPATH=$tree/src:$TOOLS/rl_peer/site" \
        "RL_PEER_DEPS=$tree/deps" VLLM_ALLOW_INSECURE_SERIALIZATION=1 -- \
        "$PYTHON" "$TOOLS/bench/rl/rl_bench.py" run --syncs 3 --warmup 0 --out @RUN@/rl.json
}

run_numba() {
    local name=numba-cuda module
    if ! module=$("${RECORD[@]}" find "${NUMBA_MODULES[@]}" 2>/dev/null); then
        note "$name: skipped: $PYTHON finds none of ${NUMBA_MODULES[*]}"
        return
    fi
    imports "$name" "$module" || return
    # unittest whatever PEER_RUNNER says: pytest names a test file by the
    # folders above it that hold an __init__.py, and numba-cuda's installed
    # layout (numba_cuda/numba/cuda/...) makes that "cuda.tests...", which
    # does not import; unittest imports the module by its real name.
    run_suite "$name" -- "${RECORD[@]}" unittest "$module"
}

bash "$(dirname "${BASH_SOURCE[0]}")/need_gpu.sh" peer || exit $?
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ ! -f "$LIB" ]; then
    echo "peer: $LIB not found (build it first, or set IPCCACHE_LIB)" >&2
    exit 2
fi
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")  # the tests change directory
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PEER_DIR=$(cd "$PEER_DIR" 2>/dev/null && pwd || echo "$PEER_DIR")

RUNNER=${PEER_RUNNER:-}
if [ -z "$RUNNER" ]; then
    RUNNER=unittest
    "$PYTHON" -c 'import pytest' 2>/dev/null && RUNNER=pytest
fi
case $RUNNER in
    pytest|unittest) ;;
    *) echo "peer: PEER_RUNNER must be pytest or unittest, not '$RUNNER'" >&2; exit 2 ;;
esac
TORCH_VERSION=$("$PYTHON" -c 'import torch; assert torch.cuda.is_available(); print(torch.__version__)' 2>/dev/null)
note "$NGPU GPU(s); shim $LIB; runner $RUNNER; torch ${TORCH_VERSION:-none}; results in $OUT_DIR"

for suite in $SUITES; do
    case $suite in
        pytorch|pytorch-expandable|numba-cuda|sglang|sglang-unit|sglang-driver|rl) ;;
        *) echo "peer: unknown suite '$suite' in PEER_SUITES" >&2; exit 2 ;;
    esac
done

DIFFERING=0
for suite in $SUITES; do
    case $suite in
        pytorch) run_torch pytorch "" ;;
        pytorch-expandable) run_torch pytorch-expandable expandable_segments:True ;;
        numba-cuda) run_numba ;;
        sglang) run_sglang_unit; run_sglang_driver ;;
        sglang-unit) run_sglang_unit ;;
        sglang-driver) run_sglang_driver ;;
        rl) run_rl ;;
    esac
done
[ "$DIFFERING" -eq 0 ]
