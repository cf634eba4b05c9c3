#!/usr/bin/env bash
#
# test_peer.sh - tests of tools/peer_suites.sh without a GPU: stand-ins for
# nvidia-smi, torch, numba's IPC tests and PyTorch's test file, whose outcomes
# change on purpose when LD_PRELOAD is set, go through the real script, once
# per runner (pytest only where it is importable). The preloaded library is a
# stand-in too: nothing here touches CUDA. The runner's own skips (no GPU,
# no copy of a project's tests) are cases here; the pytest runner's cases
# are skipped where pytest is not importable.

set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/tap.sh
. "$root/tests/tap.sh"

tap_setup peer
SCRIPT=$root/tools/peer_suites.sh
PY=${PYTHON:-python3}
# The interpreter itself, not a wrapper script: quicker.
PY=$("$PY" -c 'import sys; print(sys.executable)') || exit 1
unset PYTORCH_CUDA_ALLOC_CONF PEER_SUITES PEER_RUNNER PEER_TIMEOUT

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
if "$PY" -c 'import pytest' 2>/dev/null; then
    runners+=(pytest)
else
    skip "pytest: the runner's cases" "pytest is not installed for $PY"
fi

for r in "${runners[@]}"; do
    peer "$r" "$r-all"
    expect_status "$r: an outcome that differs fails the run" $? 1
    out=$tmp/$r-all.out
    expect "$r: the default pool has the same outcomes" "$out" '^peer: pytorch: 5 same, 0 differ$'
    expect "$r: the stand-in's one expandable-segments difference is reported" "$out" '^peer: pytorch-expandable: 4 same, 1 differ$'
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
expect_status "without a GPU it is skipped (77)" $st 77
expect "without a GPU it says so" "$tmp/nogpu.out" '^peer: no NVIDIA GPU found; skipped \(exit status 77\)$'

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

cp -r "$tmp/py" "$tmp/py-nofilecheck"
echo 'import filecheck_standin_missing' >"$tmp/py-nofilecheck/numba/cuda/tests/cudapy/test_ipc.py"
peer unittest nofilecheck PEER_SUITES=numba-cuda PYTHONPATH="$tmp/py-nofilecheck"
expect_status "numba's IPC tests that do not import are skipped" $? 0
expect "numba's IPC tests that do not import are named" "$tmp/nofilecheck.out" \
    '^peer: numba-cuda: skipped: numba.cuda.tests.cudapy.test_ipc does not import:$'
expect "the import error names the missing module" "$tmp/nofilecheck.out" \
    "No module named 'filecheck_standin_missing'"

# The summary line of a run on expandable segments: its hits are VMM ones.
mkdir -p "$tmp/vmmstats"
echo '{"opens":0,"hits":0,"vmm_imports":52,"vmm_import_hits":50,"vmm_maps":52,"vmm_map_hits":49}' \
    >"$tmp/vmmstats/ipccache-1.json"
"$PY" "$root/tools/peer_record.py" stats "$tmp/vmmstats" >"$tmp/vmmstats.out" 2>&1
expect "the stats summary counts VMM imports and maps" "$tmp/vmmstats.out" \
    '^1 process\(es\) reported: .*vmm_imports 52, vmm_import_hits 50, vmm_maps 52, vmm_map_hits 49'

# ---- sglang: the fetched copy's checks, its unit test, the driver's arguments --

# fetched DIR: a stand-in of what tools/sglang_peer/fetch.sh leaves: SGLang's
# files packed, one package in deps.tar.xz, the unit test (which passes both
# ways), MANIFEST.
fetched() {
    local dir=$1/sglang
    mkdir -p "$dir"
    "$PY" - "$dir" <<'PYEOF' || return 1
import io, sys, tarfile
d = sys.argv[1]
def add(tar, name, text):
    info = tarfile.TarInfo(name)
    data = text.encode()
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
with tarfile.open(f"{d}/sglang-py.tar.xz", "w:xz") as tar:
    for pkg in ("sglang", "sglang/srt", "sglang/srt/multimodal", "sglang/srt/multimodal/transport"):
        add(tar, f"{pkg}/__init__.py", "")
    add(tar, "sglang/srt/multimodal/transport/cuda_ipc.py", "POOL = 'standin'\n")
with tarfile.open(f"{d}/deps.tar.xz", "w:xz") as tar:
    add(tar, "./standin_dep.py", "VALUE = 7\n")
with open(f"{d}/WHEELS", "w") as f:
    f.write("0" * 64 + "  standin_dep-1.0-py3-none-any.whl\n")
with open(f"{d}/test_cuda_ipc_transport.py", "w") as f:
    f.write("""import unittest
import standin_dep
from sglang.srt.multimodal.transport.cuda_ipc import POOL
from sglang.test.test_utils import CustomTestCase

class TestCudaIpcTransport(CustomTestCase):
    def test_pool(self):
        self.assertEqual((POOL, standin_dep.VALUE), ("standin", 7))

    def test_ipython_is_a_standin(self):
        from IPython.display import HTML
        with self.assertRaises(RuntimeError):
            HTML("x")

    def test_sgl_kernel_is_a_standin(self):
        from sgl_kernel import int8_scaled_mm
        with self.assertRaisesRegex(RuntimeError, "sgl_kernel.int8_scaled_mm is a stand-in"):
            int8_scaled_mm()
        # Anything not listed stays missing: SGLang's own fallbacks apply.
        with self.assertRaises(ImportError):
            from sgl_kernel import top_k_renorm_prob
        with self.assertRaises(ImportError):
            from sgl_kernel.scalar_type import scalar_types
""")
with open(f"{d}/VERSION", "w") as f:
    f.write("0.0.1\n")
PYEOF
    (cd "$dir" && sha256sum VERSION WHEELS sglang-py.tar.xz deps.tar.xz test_cuda_ipc_transport.py >MANIFEST)
}

# sg NAME DIR [VAR=VALUE...]: the script's sglang suites on the fetched copy in DIR.
sg() {
    local name=$1 dir=$2
    shift 2
    env PATH="$tmp/gpu:$PATH" PYTHONPATH="$tmp/py" IPCCACHE_LIB="$lib" OUT_DIR="$tmp/out-$name" \
        PYTHON="$PY" "$@" bash "$SCRIPT" "$dir" >"$tmp/$name.out" 2>&1
}

fetched "$tmp/sg" || not_ok "the stand-in of the fetched SGLang is built"
sg sg "$tmp/sg" PEER_SUITES=sglang-unit
expect_status "sglang-unit: the fetched unit test runs both ways" $? 0
expect "sglang-unit: its tests are compared" "$tmp/sg.out" '^peer: sglang-unit: 3 same, 0 differ$'
expect "sglang-unit: the stand-ins and the wheels are on the path" "$tmp/sg.out" \
    'test_ipython_is_a_standin +passed +passed'
expect "sglang-unit: the release is named" "$tmp/sg.out" '^peer: sglang: 0.0.1 from '
expect "sglang-unit: a native kernel package is a stand-in that raises when called" "$tmp/sg.out" \
    'test_sgl_kernel_is_a_standin +passed +passed'
# Where the real package is installed, it is the one imported.
mkdir -p "$tmp/realkernel/sgl_kernel"
echo 'REAL = True' >"$tmp/realkernel/sgl_kernel/__init__.py"
PYTHONPATH="$root/tools/sglang_peer/site:$tmp/realkernel" "$PY" -c \
    'import sgl_kernel, sys; sys.exit(0 if getattr(sgl_kernel, "REAL", False) else 1)'
expect_status "sglang-unit: an installed package wins over its stand-in" $? 0

# sg_fail NAME WHAT: the sglang suite on the broken copy in $tmp/sgb stops with status 2.
sg_fail() {
    sg "$1" "$tmp/sgb" PEER_SUITES=sglang
    expect_status "sglang: $2 is a setup error" $? 2
    expect_not "sglang: $2: nothing ran" "$tmp/$1.out" 'exit status'
}
sg_fail sg-none "no fetched copy"
# shellcheck disable=SC2016  # the backquotes are the message's own
expect "sglang: no fetched copy: make peer-fetch is named" "$tmp/sg-none.out" 'no .*MANIFEST: run `make peer-fetch`'
cp -r "$tmp/sg" "$tmp/sgb"
rm "$tmp/sgb/sglang/deps.tar.xz"
sg_fail sg-missing "a missing file"
expect "sglang: a missing file is named" "$tmp/sg-missing.out" 'missing .*sglang/deps.tar.xz \(MANIFEST names it\)'
rm -rf "$tmp/sgb" && cp -r "$tmp/sg" "$tmp/sgb"
echo "# changed" >>"$tmp/sgb/sglang/test_cuda_ipc_transport.py"
sg_fail sg-changed "a changed file"
expect "sglang: a changed file is named" "$tmp/sg-changed.out" \
    'test_cuda_ipc_transport.py differs from what MANIFEST says'
rm -rf "$tmp/sgb" && cp -r "$tmp/sg" "$tmp/sgb"
grep -v ' deps.tar.xz$' "$tmp/sg/sglang/MANIFEST" >"$tmp/sgb/sglang/MANIFEST"
sg_fail sg-unlisted "a MANIFEST without one of the fetched files"
expect "sglang: the file MANIFEST lacks is named" "$tmp/sg-unlisted.out" 'MANIFEST does not name deps.tar.xz'

# The RL projects' suite: no fetched copy stops it before anything runs.
sg rl-none "$tmp/sgb" PEER_SUITES=rl
expect_status "rl: no fetched copy is a setup error" $? 2
# shellcheck disable=SC2016  # the backquotes are the message's own
expect "rl: no fetched copy: make peer-fetch is named" "$tmp/rl-none.out" 'peer: rl: no .*rl/MANIFEST: run `make peer-fetch`'

# The driver's arguments and its report need no GPU and no torch.
drv=$root/tools/sglang_peer/driver.py
"$PY" "$drv" run --configs legacy:maybe >"$tmp/drv.out" 2>&1
expect_status "sglang-driver: an unknown configuration is a usage error" $? 2
expect "sglang-driver: the configurations are listed" "$tmp/drv.out" \
    "choose from legacy:off, legacy:on, expandable:off, expandable:on"
"$PY" "$drv" run --features 0 >"$tmp/drv.out" 2>&1
expect_status "sglang-driver: no features is a usage error" $? 2
"$PY" "$drv" run --rows 100000 --cols 100000 >"$tmp/drv.out" 2>&1
expect_status "sglang-driver: features that do not fit the pool are a usage error" $? 2
cat >"$tmp/without.json" <<'JSON'
{"results": [{"config": "legacy:off", "alloc": "legacy", "sglang_cache": "off", "median_us": 600.4, "stats": null},
             {"config": "expandable:off", "alloc": "expandable", "sglang_cache": "off", "median_us": 3100.0}]}
JSON
cat >"$tmp/with.json" <<'JSON'
{"results": [{"config": "legacy:off", "alloc": "legacy", "sglang_cache": "off", "median_us": 333.0,
              "stats": {"opens": 520, "hits": 519}},
             {"config": "expandable:off", "alloc": "expandable", "sglang_cache": "off", "median_us": null,
              "error": "no result", "stats": {"vmm_imports": 13520, "vmm_import_hits": 13494}}]}
JSON
"$PY" "$drv" report "$tmp/without.json" "$tmp/with.json" >"$tmp/report.out" 2>&1
expect_status "sglang-driver: report of two runs" $? 0
expect "sglang-driver: report: a legacy row with the consumer's open hits" "$tmp/report.out" \
    '^\| legacy, cache off \| 600 µs \| 333 µs \| 519 of 520 opens \|$'
expect "sglang-driver: report: a failed configuration says so, with its import hits" "$tmp/report.out" \
    '^\| expandable, cache off \| 3,100 µs \| failed \| 13,494 of 13,520 imports \|$'
"$PY" "$drv" report "$tmp/without.json" >"$tmp/report.out" 2>&1
expect_status "sglang-driver: report of one run is a usage error" $? 2

# The driver's processes on stand-ins of torch and of SGLang's transport: the
# producer's proxies reach the consumer, each value is checked (the stand-in
# pool corrupts one feature when STANDIN_CORRUPT is set), and the consumer's
# stats line (written by the stand-in at exit, as the library would) is read.
mkdir -p "$tmp/drvpy/torch/cuda" "$tmp/drvpy/sglang/srt/multimodal/transport"
cat >"$tmp/drvpy/torch/__init__.py" <<'PYEOF'
class _Values:
    def __init__(self, value):
        self.value = value
    def __eq__(self, other):
        return _Values(self.value == other)
    def all(self):
        return self.value
    def sum(self):
        return self
    def item(self):
        return self.value
bfloat16 = "bf16"
def ones(*_args, **_kwargs):
    return _Values(1.0)
def full(_shape, value, **_kwargs):
    return _Values(value)
from . import cuda
PYEOF
echo 'def set_device(_d): pass' >"$tmp/drvpy/torch/cuda/__init__.py"
for d in sglang sglang/srt sglang/srt/multimodal sglang/srt/multimodal/transport; do
    : >"$tmp/drvpy/$d/__init__.py"
done
cat >"$tmp/drvpy/sglang/srt/multimodal/transport/cuda_ipc.py" <<'PYEOF'
import atexit, json, os
if os.environ.get("STANDIN_BROKEN"):
    raise ImportError("stand-in of a module that does not import")
MM_ITEM_MEMORY_POOL_RECYCLE_INTERVAL = 0.05
OPENS = [0]

class Proxy:
    def __init__(self, value):
        self.value = value
    def reconstruct_on_target_device(self, _device):
        import torch
        OPENS[0] += 1
        return torch._Values(self.value)

class MmItemMemoryPool:
    def __init__(self, memory_size, recycle_interval, base_gpu_id, consumer_count):
        assert recycle_interval == MM_ITEM_MEMORY_POOL_RECYCLE_INTERVAL
        self.wrapped = 0
    def wrap_tensor(self, tensor, *, use_pool_handle_cache):
        self.wrapped += 1
        bad = os.environ.get("STANDIN_CORRUPT") and self.wrapped == 7
        return Proxy(-1.0 if bad else tensor.value)
    def shutdown(self):
        pass

@atexit.register
def _stats():
    path = os.environ.get("IPCCACHE_STATS_FILE", "").replace("%p", str(os.getpid()))
    if path and OPENS[0]:
        with open(path, "w") as f:
            f.write(json.dumps({"opens": OPENS[0], "hits": OPENS[0] - 1}) + "\n")
PYEOF
drv_run() {  # NAME ARGS...: the driver on the stand-ins
    local name=$1
    shift
    env PYTHONPATH="$tmp/drvpy" PEER_RECORD="$tmp/$name.tsv" IPCCACHE_STATS_FILE="$tmp/$name-%p.json" \
        "$PY" "$drv" run --features 30 --warmup 2 --timeout 60 --out "$tmp/$name.json" "$@" \
        >"$tmp/$name.out" 2>&1
}
drv_run drv-ok --configs legacy:off,expandable:on
expect_status "sglang-driver: every value right passes" $? 0
expect "sglang-driver: a row per configuration, with the consumer's hits" "$tmp/drv-ok.out" \
    "^sglang-driver: legacy allocator, SGLang's cache off: 30 features, median .* wrong values 0; consumer: legacy opens 32 \(31 hits\)"
expect "sglang-driver: the closing line" "$tmp/drv-ok.out" '^sglang-driver: 2 passed, 0 failed$'
expect "sglang-driver: each configuration is recorded for the comparison" "$tmp/drv-ok.tsv" \
    '^sglang_driver::expandable:on	passed$'
STANDIN_CORRUPT=1 drv_run drv-bad --configs legacy:on
expect_status "sglang-driver: a wrong value fails the run" $? 1
expect "sglang-driver: the wrong value is counted" "$tmp/drv-bad.out" 'wrong values 1'
expect "sglang-driver: a wrong value is recorded as a failure" "$tmp/drv-bad.tsv" \
    '^sglang_driver::legacy:on	failed$'

STANDIN_BROKEN=1 drv_run drv-broken --configs legacy:off
expect_status "sglang-driver: a transport that does not import fails the run" $? 1
expect "sglang-driver: ... and the configuration says so" "$tmp/drv-broken.out" \
    '^sglang-driver: legacy:off: FAILED: no result from the consumer'

tap_summary peer-suites
