#!/usr/bin/env bash
#
# test_mm_ipc_bench.sh - tests of the vllm-mm part (tools/bench/rl/mm_ipc_bench.py,
# bench.sh's part vllm-mm) without a GPU: the usage errors and skips (no GPU:
# exit 77; no fetched copy: make peer-fetch named), the summary's and the
# report's arithmetic on made-up requests, and, where a PyTorch and the fetched
# copy are here, the whole run on CPU tensors (--device cpu): vLLM's own sender
# and receiver between the two processes, every value checked, and a feature
# that differs caught. MM_TEST_PYTHON names a python with PyTorch (default:
# PYTHON, else python3); RL_TEST_FETCHED the fetched copy (default .peer/rl).
#
# Prints "ok - NAME" / "not ok - NAME" per case and ends with the line
# "mm-ipc-bench: N passed, M failed, K skipped"; exits non-zero on any failure.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$(dirname "$here")")
BENCH=$root/tools/bench/rl/mm_ipc_bench.py
PY=${PYTHON:-python3}
PY=$("$PY" -c 'import sys; print(sys.executable)') || exit 1
TORCH_PY=${MM_TEST_PYTHON:-$PY}
FETCHED=${RL_TEST_FETCHED:-$root/.peer/rl}

source "$root/tests/tap.sh"
tap_setup mm-ipc-bench
unset PYTORCH_CUDA_ALLOC_CONF BENCH_PARTS BENCH_VLLM_MM PEER_DIR

# Stand-in torch: a GPU or none (MM_TEST_GPUS).
mkdir -p "$tmp/torch/torch" "$tmp/bin" "$tmp/empty"
cat >"$tmp/torch/torch/__init__.py" <<'EOF'
import os
class cuda:
    @staticmethod
    def is_available():
        return int(os.environ.get("MM_TEST_GPUS", "0")) > 0
    @staticmethod
    def device_count():
        return int(os.environ.get("MM_TEST_GPUS", "0"))
EOF

run() {  # run NAME ARGS...: the bench with the stand-in torch; output in $tmp/NAME.out
    local name=$1
    shift
    PYTHONPATH=$tmp/torch timeout 60 "$PY" "$BENCH" "$@" >"$tmp/$name.out" 2>&1
}

# ---- arguments, skips -------------------------------------------------------
run zero run --requests 0
expect_status "--requests 0 is a usage error" $? 2
run dev run --device gpu
expect_status "an unknown --device is a usage error" $? 2
run onefile report "$tmp/a.json"
expect_status "report takes two or three files" $? 2
MM_TEST_GPUS=0 run nogpu run
expect_status "no GPU: exit 77 (skipped)" $? 77
expect "no GPU: it says it is skipped" "$tmp/nogpu.out" '^vllm-mm: skipped: no CUDA GPU'
MM_TEST_GPUS=1 run nofiles run
expect_status "no fetched file: exit 2" $? 2
# shellcheck disable=SC2016  # the backquotes are the message's own
expect "no fetched file: tensor_ipc.py and make peer-fetch are named" "$tmp/nofiles.out" \
    'vllm/v1/engine/tensor_ipc.py is missing: run `make peer-fetch`'

# bench.sh's part vllm-mm, a GPU but no fetched copy: skipped, said so.
printf '#!/bin/sh\necho "GPU 0: Stand-in (UUID: GPU-0)"\n' >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
: >"$tmp/lib.so"
MM_TEST_GPUS=1 PATH=$tmp/bin:$PATH PYTHONPATH=$tmp/torch PYTHON=$PY NVCC=/bin/false IPCCACHE_LIB=$tmp/lib.so \
    BENCH_PARTS=vllm-mm BENCH_OUT=$tmp/res PEER_DIR=$tmp/empty timeout 60 bash "$root/tools/bench/bench.sh" \
    >"$tmp/part.out" 2>&1
expect_status "bench.sh part vllm-mm without the fetched copy: exit 0" $? 0
expect "bench.sh part vllm-mm without the fetched copy: skipped, make peer-fetch named" "$tmp/part.out" \
    'vllm-mm: skipped: no .*/rl/MANIFEST \(run make peer-fetch'

# ---- the arithmetic and the report -------------------------------------------
PYTHONPATH=$root/tools/bench/rl "$PY" - "$tmp" >"$tmp/arith.out" 2>&1 <<'EOF'
import json, sys
import mm_ipc_bench as m
import rl_bench as rl
d = sys.argv[1]
G = 1 << 30
zero = dict.fromkeys(rl.COUNTERS, 0)
per = m.counters_per_request({**zero, "opens": 10, "hits": 2}, {**zero, "opens": 410, "hits": 302}, 100)
assert per["opens"] == 4.0 and per["hits"] == 3.0 and per["evictions"] == 0, per
assert m.counters_per_request(None, {**zero, "opens": 4}, 10) is None

def rec(lat, ok=True, k=2):
    return {"req_ms": lat * k, "values_ok": ok, "bad": [] if ok else [1], "lat_ms": [lat] * k,
            "send_ms": [0.1] * k, "recv_ms": [lat / 2] * k, "rebuild_ms": [lat / 4] * k,
            "check_ms": [0.2] * k, "release_ms": [0.05] * k}

def side(opens, hits, free, fds, idle=0):
    stats = {**zero, "opens": opens, "hits": hits, "idle_bytes": idle, "ghost_bytes": 0}
    return {"stats": stats, "fds": fds, "free": free * G, "reserved": G}

def result(lats, elapsed, free=120.0, hits=0, ok=True):
    recs = [rec(9.0)] + [rec(x, ok or i != 1) for i, x in enumerate(lats)]
    return {"records": recs, "error": None, "elapsed_s": elapsed,
            "mark": {"engine": side(8, 0, 121.0, 40), "server": side(0, 0, 121.0, 30)},
            "end": {"engine": side(8 + 2 * len(lats), hits, free, 41, idle=G), "server": side(0, 0, free, 30)}}

s = m.summarize(result([1.0, 3.0, 2.0, 4.0], 0.5), 1)
assert s["requests"] == 5 and s["timed"] == 4 and s["features"] == 2, s
assert s["req_per_s"] == 8.0 and s["lat_p50_ms"] == 2.0 and s["lat_p99_ms"] == 4.0, s
assert s["phase_p50_ms"]["recv"] == 1.25 and s["phase_p50_ms"]["send"] == 0.1, s
assert s["values_ok"] and s["bad_requests"] == [] and s["engine_free_gib"] == 120.0, s
assert s["engine_per_request"]["opens"] == 2.0 and s["engine_fds"] == [40, 41], s
assert s["engine_levels_last"]["idle_bytes"] == G, s
bad = m.summarize(result([1.0, 2.0, 3.0], 1.0, ok=False), 1)
assert not bad["values_ok"] and bad["bad_requests"] == [2], bad
none = m.summarize({"records": [], "error": "no result in time"}, 1)
assert none["req_per_s"] is None and none["lat_p50_ms"] is None and not none["values_ok"], none

args = {"requests": 4, "warmup": 1, "features": 2, "rows": 1176, "hidden": 3584, "device": "cuda"}
def write(label, alloc_figs):
    res = []
    for alloc, (lats, elapsed, free, hits, ok) in alloc_figs.items():
        r = result(lats, elapsed, free, hits, ok)
        r.update(alloc=alloc, summary=m.summarize(r, 1))
        if not ok:
            r["error"] = "a received feature differed from the API server's"
        res.append(r)
    json.dump({"kind": "vllm-mm", "label": label, "args": args, "results": res}, open(f"{d}/mm_{label}.json", "w"))
write("A1", {"legacy": ([2.0] * 4, 0.5, 120.0, 0, True), "expandable": ([4.0] * 4, 1.0, 120.0, 0, True)})
write("B", {"legacy": ([1.0] * 4, 0.25, 118.0, 8, True), "expandable": ([4.0] * 4, 1.25, 120.0, 8, False)})
write("A2", {"legacy": ([2.0] * 4, 0.5, 120.0, 0, True), "expandable": ([4.0] * 4, 1.0, 120.0, 0, True)})
print("arith: fine")
EOF
expect "counters per request, a run's summary, bad requests named, an empty run" "$tmp/arith.out" '^arith: fine$'
run report report "$tmp/mm_A1.json" "$tmp/mm_B.json" "$tmp/mm_A2.json"
expect_status "report: three files" $? 0
expect "report: the load is said" "$tmp/report.out" \
    '^Per allocator: 4 timed requests after 1, one in flight, each 2 features of 1176 x 3584 bf16 \(8.0 MiB\)'
expect "report: a row shows A1 / B / A2 and the gain" "$tmp/report.out" \
    '^\| legacy \| 8.0 / \*\*16.0\*\* / 8.0 \| 2.00x \| 2.00 / \*\*1.00\*\* / 2.00 \| 2.00 / \*\*1.00\*\* / 2.00 \| same \| 120.00 / \*\*118.00\*\* / 120.00 \|$'
expect "report: values that differ are flagged in the row" "$tmp/report.out" '^\| expandable \| .* \| DIFFER \|'
expect "report: an allocator slower with the library is flagged" "$tmp/report.out" \
    '^- expandable: slower with the library than a run without \(3.2 req/s against 4.0\)$'
expect "report: memory past 1% is flagged" "$tmp/report.out" \
    '^- legacy: device free memory after the run -1.7% with the library \(target: within 1%\)$'
expect "report: values that differ are said" "$tmp/report.out" \
    "^- expandable: a received feature differed from the API server's$"
expect "report: a failed run is named" "$tmp/report.out" "^- B expandable: FAILED: a received feature differed"
expect "report: where a feature goes" "$tmp/report.out" '^\| legacy \| rebuild \| 0.500 / \*\*0.250\*\* / 0.500 \|$'
expect "report: the library's counters per request" "$tmp/report.out" \
    '^\| legacy \| 2 / 2 \| 0 / 0 \| 0 / 0 \| 0 \| 0 / 0 \| 1.00 \| 0.00 \| 40 → 41 \|$'
echo '{"kind": "rl", "results": []}' >"$tmp/other.json"
run mixed report "$tmp/mm_A1.json" "$tmp/other.json"
expect_status "report: another bench's file is refused" $? 2

# ---- the run itself, on CPU tensors ------------------------------------------
if ! "$TORCH_PY" -c 'import torch' >/dev/null 2>&1; then
    skip "cpu run: vLLM's sender and receiver between two processes" \
        "no PyTorch for $TORCH_PY (MM_TEST_PYTHON names a python with it)"
elif [[ ! -f $FETCHED/MANIFEST ]]; then
    skip "cpu run: vLLM's sender and receiver between two processes" \
        "no fetched copy at $FETCHED (make peer-fetch; or RL_TEST_FETCHED)"
elif ! "$PY" "$root/tools/rl_peer/prepare.py" "$FETCHED" "$tmp/tree" >"$tmp/prep.out" 2>&1; then
    TAP_SHOW=$tmp/prep.out check "cpu run: the fetched copy unpacks" false
else
    site=$root/tools/rl_peer/site
    PYTHONPATH=$tmp/tree/src:$site timeout 240 "$TORCH_PY" "$BENCH" run --device cpu --allocs legacy \
        --requests 8 --warmup 2 --features 3 --rows 16 --hidden 24 --label A1 --out "$tmp/cpu.json" \
        >"$tmp/cpu.out" 2>&1
    expect_status "cpu run: exit 0" $? 0
    PYTHONPATH=$root/tools/bench/rl "$PY" - "$tmp/cpu.json" >"$tmp/cpujson.out" 2>&1 <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
assert run["kind"] == "vllm-mm" and run["label"] == "A1", run.keys()
(r,) = run["results"]
assert r["alloc"] == "legacy" and r["error"] is None, r["error"]
assert len(r["records"]) == 10 and all(len(x["lat_ms"]) == 3 and x["values_ok"] for x in r["records"]), r["records"]
s = r["summary"]
assert s["values_ok"] and s["timed"] == 8 and s["features"] == 3 and s["req_per_s"] > 0, s
assert r["mark"]["engine"]["fds"] and r["end"]["server"]["fds"], (r["mark"], r["end"])
print("cpu json: fine")
EOF
    expect "cpu run: every feature's checksum the API server's, 10 requests of 3, the measures" \
        "$tmp/cpujson.out" '^cpu json: fine$'
    # vLLM's metadata through one process's queue; a feature that differs is caught.
    PYTHONPATH=$tmp/tree/src:$site:$root/tools/bench/rl timeout 120 "$TORCH_PY" - >"$tmp/consume.out" 2>&1 <<'EOF'
import torch, torch.multiprocessing as tmp
import mm_ipc_bench as m
eb = m.eb
from vllm.v1.engine.tensor_ipc import TensorIpcReceiver, TensorIpcSender
q = tmp.get_context("spawn").Queue()
sender, receiver = TensorIpcSender(q), TensorIpcReceiver(q)
feats = [torch.randn(8, 4, dtype=torch.bfloat16) for _ in range(2)]
want = [eb.checksum(torch, f).item() for f in feats]
sender.new_message()
metas = [("bfloat16", (8, 4), sender(f)) for f in feats]
assert [mt[2]["tensor_id"] for mt in metas] == [0, 1] and metas[0][2]["message_id"] == 1, metas
rec = m.consume(torch, receiver, {"rebuild": 0}, metas, want, [0, 0])
assert rec["values_ok"] and rec["bad"] == [] and len(rec["lat_ms"]) == 2, rec
class Stale:  # a receiver handing back another buffer for the second feature
    def __call__(self, dtype, shape, meta):
        return feats[meta["tensor_id"]] + (meta["tensor_id"] == 1)
rec = m.consume(torch, Stale(), {"rebuild": 0}, [(None, None, {"tensor_id": i}) for i in range(2)], want, [0, 0])
assert not rec["values_ok"] and rec["bad"] == [1], rec
print("consume: fine")
EOF
    expect "consume: vLLM's metadata names each tensor; a feature that differs is caught" \
        "$tmp/consume.out" '^consume: fine$'
fi

tap_summary mm-ipc-bench
