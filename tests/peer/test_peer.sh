#!/usr/bin/env bash
#
# test_peer.sh - tests of tools/peer_suites.sh without a GPU: stand-ins for
# nvidia-smi, torch, numba's IPC tests and PyTorch's test file, whose outcomes
# change on purpose when LD_PRELOAD is set, go through the real script, once
# per runner (pytest only where it is importable). The preloaded library is a
# stand-in too: nothing here touches CUDA.
#
# Prints "ok - NAME" / "not ok - NAME" per case and ends with the line
# "peer-suites: N passed, M failed"; exits non-zero on any failure.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$(dirname "$here")")
SCRIPT=$root/tools/peer_suites.sh
PY=${PYTHON:-python3}
# The interpreter itself, not a wrapper script: quicker.
PY=$("$PY" -c 'import sys; print(sys.executable)') || exit 1

unset LD_PRELOAD PYTORCH_CUDA_ALLOC_CONF PEER_SUITES PEER_RUNNER PEER_TIMEOUT
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ipccache-peer.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

passed=0 failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; failed=$((failed + 1)); }
# expect NAME FILE PATTERN: FILE has a line matching the extended regex PATTERN.
expect() {
    if grep -Eq -- "$3" "$2"; then ok "$1"; else not_ok "$1 (no line /$3/ in $2)"; cat "$2"; fi
}
# expect_not NAME FILE PATTERN: no line of FILE matches PATTERN.
expect_not() {
    if grep -Eq -- "$3" "$2"; then not_ok "$1 (line /$3/ in $2)"; cat "$2"; else ok "$1"; fi
}
expect_status() {
    if [[ $2 -eq $3 ]]; then ok "$1"; else not_ok "$1 (status $2, wanted $3)"; fi
}

# ---- stand-ins ---------------------------------------------------------------

mkdir -p "$tmp/gpu" "$tmp/nogpu" "$tmp/py/torch/testing/_internal" "$tmp/py/numba/cuda/tests/cudapy" "$tmp/peer"
printf '#!/bin/sh\necho "GPU 0: Stand-in (UUID: GPU-0)"\n' >"$tmp/gpu/nvidia-smi"
printf '#!/bin/sh\nexit 9\n' >"$tmp/nogpu/nvidia-smi"
chmod +x "$tmp/gpu/nvidia-smi" "$tmp/nogpu/nvidia-smi"

cat >"$tmp/py/torch/__init__.py" <<'EOF'
__version__ = "0.0+standin"
class cuda:
    @staticmethod
    def is_available():
        return True
EOF
for d in torch/testing torch/testing/_internal numba numba/cuda numba/cuda/tests numba/cuda/tests/cudapy; do
    : >"$tmp/py/$d/__init__.py"
done
: >"$tmp/py/torch/testing/_internal/common_utils.py"
cat >"$tmp/py/numba/cuda/tests/cudapy/test_ipc.py" <<'EOF'
import unittest

class TestIpcMemory(unittest.TestCase):
    def test_ipc_handle(self):
        pass

    @unittest.skip("needs two GPUs")
    def test_staged(self):
        pass
EOF
# The same names as PyTorch's file; which ones differ is chosen by the environment.
cat >"$tmp/peer/test_multiprocessing.py" <<'EOF'
import os
import time
import unittest

PRELOADED = bool(os.environ.get("LD_PRELOAD"))
EXPANDABLE = "expandable" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")

class TestMultiprocessing(unittest.TestCase):
    def test_cuda_simple(self):
        pass

    def test_cuda_variable_sharing(self):
        self.assertFalse(PRELOADED and EXPANDABLE, "differs with expandable segments only")

    def test_event_multiprocess(self):
        if PRELOADED and os.environ.get("STANDIN_HANG"):
            time.sleep(600)

    def test_fs_sharing(self):
        raise AssertionError("not a CUDA test: must not run")

    @unittest.skip("slow")
    def test_cuda_send_many(self):
        pass

    def test_leaf_variable_sharing(self):
        with self.subTest(kind="cuda"):
            self.assertFalse(PRELOADED and os.environ.get("STANDIN_SUBTEST"))
EOF

# Any shared object will do as the preload. Not the real library: tools that
# look for processes that map it (ipccache-stats --all) must not find these.
lib=$tmp/libstandin.so
echo 'int standin_symbol;' | ${CC:-cc} -shared -fPIC -x c -o "$lib" - || exit 1

# peer RUNNER NAME [VAR=VALUE...]: the script on the stand-ins; output in $tmp/NAME.out.
peer() {
    local runner=$1 name=$2
    shift 2
    env PATH="$tmp/gpu:$PATH" PYTHONPATH="$tmp/py" IPCCACHE_LIB="$lib" PEER_RUNNER="$runner" \
        OUT_DIR="$tmp/out-$name" PYTHON="$PY" "$@" bash "$SCRIPT" "$tmp/peer" >"$tmp/$name.out" 2>&1
}

# ---- cases -------------------------------------------------------------------

runners=(unittest)
"$PY" -c 'import pytest' 2>/dev/null && runners+=(pytest)
[[ ${#runners[@]} -eq 2 ]] || echo "# pytest is not importable by $PY: its runner is not tested"

for r in "${runners[@]}"; do
    peer "$r" "$r-all"
    expect_status "$r: an outcome that differs fails the run" $? 1
    out=$tmp/$r-all.out
    expect "$r: the default pool has the same outcomes" "$out" '^peer: pytorch: 5 same, 0 differ$'
    expect "$r: expandable segments differ in one test" "$out" '^peer: pytorch-expandable: 4 same, 1 differ$'
    expect "$r: the differing test is shown with both outcomes" "$out" \
        'test_cuda_variable_sharing +passed +failed +DIFFERS'
    expect "$r: a skipped test is compared as skipped" "$out" 'test_cuda_send_many +skipped +skipped *$'
    expect_not "$r: only the CUDA tests run" "$out" 'test_fs_sharing'
    expect "$r: numba's IPC tests are found in the package" "$out" '^peer: numba-cuda: 2 same, 0 differ$'

    peer "$r" "$r-hang" PEER_SUITES=pytorch PEER_TIMEOUT=5 STANDIN_HANG=1
    expect_status "$r: a hung run fails" $? 1
    expect "$r: a hung run is reported as a timeout" "$tmp/$r-hang.out" 'with: timed out after 5s'
    expect "$r: the hung test has no result" "$tmp/$r-hang.out" 'test_event_multiprocess +passed +no-result +DIFFERS'
    expect "$r: tests finished before the hang keep their outcome" "$tmp/$r-hang.out" \
        'test_cuda_simple +passed +passed *$'

    peer "$r" "$r-sub" PEER_SUITES=pytorch STANDIN_SUBTEST=1
    expect "$r: a failing subtest fails its test" "$tmp/$r-sub.out" \
        'test_leaf_variable_sharing +passed +failed +DIFFERS'
done

peer unittest same PEER_SUITES="pytorch numba-cuda"
expect_status "the same outcomes everywhere pass" $? 0

peer unittest badsuite PEER_SUITES="pytorch bogus"
expect_status "an unknown suite is a setup error" $? 2
expect_not "an unknown suite is refused before any run" "$tmp/badsuite.out" 'exit status'

peer unittest nogpu PATH="$tmp/nogpu:$PATH"
st=$?
expect_status "without a GPU it passes" $st 0
expect "without a GPU it says so" "$tmp/nogpu.out" '^peer: no NVIDIA GPU found; skipping$'

env PATH="$tmp/gpu:$PATH" PYTHONPATH="$tmp/py" IPCCACHE_LIB="$lib" OUT_DIR="$tmp/out-nocopy" \
    PEER_SUITES=pytorch PYTHON="$PY" bash "$SCRIPT" "$tmp/empty" >"$tmp/nocopy.out" 2>&1
expect_status "a missing copy of PyTorch's file is skipped" $? 0
expect "a missing copy is named with the torch version" "$tmp/nocopy.out" \
    'pytorch: skipped: no .*test_multiprocessing.py .*PyTorch 0.0\+standin'

cp -r "$tmp/py" "$tmp/py-notesting"
echo 'import expecttest_standin_missing' >"$tmp/py-notesting/torch/testing/_internal/common_utils.py"
peer unittest notesting PEER_SUITES=pytorch PYTHONPATH="$tmp/py-notesting"
expect_status "PyTorch's testing module that does not import is skipped" $? 0
expect "the import error of PyTorch's testing module is shown" "$tmp/notesting.out" \
    "No module named 'expecttest_standin_missing'"

echo "peer-suites: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
