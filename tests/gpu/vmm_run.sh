#!/usr/bin/env bash
# tests/gpu/vmm_run.sh - real-GPU checks of ipccache's VMM path (PyTorch's
# expandable segments); tests/gpu/run.sh's counterpart for that path.
#
#   1. vmm_errors.cu without and with the shim: the same return code in every
#      case (repeated imports return one handle with the shim: only the
#      same_handle detail may differ);
#   2. vmm_rebuild.c (26 chunks of 20 MiB, 50 rebuilds) without and with the
#      shim: the latest data read every time, one real import per chunk;
#   3. tests/gpu/torch_consumer.py with expandable_segments:True, without and
#      with the shim: every value right.
# Needs a GPU; says so and exits 0 without one. IPCCACHE_LIB names the shim.
set -u
cd "$(dirname "$0")/../.." || exit 2
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
LIB=$(realpath "${IPCCACHE_LIB:-build/libipccache.so}")
OUT=build/gpu/vmm
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "vmm_run: no NVIDIA GPU found; skipping"
    exit 0
fi
mkdir -p "$OUT"
"$NVCC" -o "$OUT/vmm_errors" tests/gpu/vmm_errors.cu -lcuda || exit 2
"$NVCC" -o "$OUT/vmm_rebuild" tests/gpu/vmm_rebuild.c -lcuda || exit 2
failed=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
shim() { LD_PRELOAD=$LIB IPCCACHE_STATS_AT_EXIT=1 IPCCACHE_STATS_FILE=$OUT/$1.%p.json "${@:2}"; }
stat_of() { grep -ho "\"$2\":[0-9]*" "$OUT"/$1.*.json | cut -d: -f2 | sort -n | tail -1; }

rm -f "$OUT"/*.json
"$OUT/vmm_errors" >"$OUT/errors_plain.txt" 2>&1
shim errors "$OUT/vmm_errors" >"$OUT/errors_shim.txt" 2>&1
strip() { sed 's/ detail=same_handle=[01]//' "$1"; }
if diff <(strip "$OUT/errors_plain.txt") <(strip "$OUT/errors_shim.txt"); then
    pass "vmm_errors: identical return codes"
else
    fail "vmm_errors: return codes differ"
fi

"$OUT/vmm_rebuild" 50 26 20 | tee "$OUT/rebuild_plain.txt" | grep -q check=ok &&
    pass "vmm_rebuild without the shim" || fail "vmm_rebuild without the shim"
shim rebuild "$OUT/vmm_rebuild" 50 26 20 | tee "$OUT/rebuild_shim.txt" | grep -q check=ok &&
    pass "vmm_rebuild with the shim: latest data every time" || fail "vmm_rebuild with the shim"
[[ $(stat_of rebuild vmm_import_hits) == $((49 * 26)) ]] &&
    pass "vmm_rebuild: one real import per chunk" || fail "vmm_rebuild: import hits"
grep -h median_us "$OUT"/rebuild_*.txt

if [[ $(nvidia-smi -L | grep -c '^GPU ') -ge 2 ]]; then
    rm -f "$OUT"/rebuild1.*.json
    "$OUT/vmm_rebuild" 50 26 20 1 | tee "$OUT/rebuild1_plain.txt" | grep -q check=ok &&
        pass "vmm_rebuild across GPUs without the shim" || fail "vmm_rebuild across GPUs"
    shim rebuild1 "$OUT/vmm_rebuild" 50 26 20 1 | tee "$OUT/rebuild1_shim.txt" |
        grep -q check=ok && pass "vmm_rebuild across GPUs with the shim" ||
        fail "vmm_rebuild across GPUs with the shim"
    [[ $(stat_of rebuild1 vmm_access_skips) == 49 ]] &&
        pass "vmm_rebuild across GPUs: set-access skipped" || fail "across GPUs: access skips"
    grep -h median_us "$OUT"/rebuild1_*.txt
else
    echo "SKIP vmm_rebuild across GPUs (one GPU)"
fi

if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    python3 tests/gpu/torch_consumer.py --iters 200 --pool-mb 512 | grep -q values_ok=1 &&
        pass "torch expandable segments without the shim" || fail "torch without the shim"
    shim torch python3 tests/gpu/torch_consumer.py --iters 200 --pool-mb 512 |
        grep -q values_ok=1 && pass "torch expandable segments with the shim" ||
        fail "torch with the shim"
    [[ $(stat_of torch vmm_import_hits) -gt 0 ]] && pass "torch: imports hit" ||
        fail "torch: no import hits"
else
    echo "SKIP torch (python3 with CUDA-enabled torch not found)"
fi
echo "vmm_run: $failed failed"
[[ $failed -eq 0 ]]
