#!/usr/bin/env bash
#
# test_engine_bench.sh - tests of the engine bench (tools/bench/engine/engine_bench.py
# and bench.sh's engine part) without a GPU and without torch: its arguments,
# its report's arithmetic on made-up results, its refusal of missing SGLang
# files (naming `make peer-fetch`), and its skip without a GPU. A stand-in
# torch module says whether a GPU is there; nothing here touches CUDA.
#
# Prints "ok - NAME" / "not ok - NAME" per case and ends with the line
# "engine-bench: N passed, M failed, K skipped"; exits non-zero on any failure.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$(dirname "$here")")
BENCH=$root/tools/bench/engine/engine_bench.py
PY=${PYTHON:-python3}
PY=$("$PY" -c 'import sys; print(sys.executable)') || exit 1

source "$root/tests/tap.sh"
tap_setup engine-bench
unset PYTORCH_CUDA_ALLOC_CONF BENCH_PARTS BENCH_TP BENCH_ENGINE PEER_DIR


# Stand-in torch: a GPU or none (ENGINE_TEST_GPUS), no CUDA anything else.
mkdir -p "$tmp/torch/torch" "$tmp/bin" "$tmp/empty"
cat >"$tmp/torch/torch/__init__.py" <<'EOF'
import os
__version__ = "0.0+standin"
class version:
    cuda = None
class cuda:
    @staticmethod
    def is_available():
        return int(os.environ.get("ENGINE_TEST_GPUS", "0")) > 0
    @staticmethod
    def device_count():
        return int(os.environ.get("ENGINE_TEST_GPUS", "0"))
EOF

run() {  # run NAME ARGS...: the bench with the stand-in torch; output in $tmp/NAME.out
    local name=$1
    shift
    PYTHONPATH=$tmp/torch timeout 60 "$PY" "$BENCH" "$@" >"$tmp/$name.out" 2>&1
}

# ---- arguments -------------------------------------------------------------
run tp0 serve --tp 0
expect_status "--tp 0 is a usage error" $? 2
expect "--tp 0: the message says why" "$tmp/tp0.out" -- '--tp must be at least 1, not 0'
run alloc serve --allocs legacy,bogus
expect_status "an unknown allocator is a usage error" $? 2
expect "an unknown allocator: the choices are named" "$tmp/alloc.out" "unknown 'bogus' \(choose from legacy, expandable\)"
run cache serve --caches on,maybe
expect_status "an unknown cache setting is a usage error" $? 2
run pool serve --pool-mb 64 --concurrency 16 --burst 0
expect_status "features that do not fit in the pool are a usage error" $? 2
expect "the pool: sizes named" "$tmp/pool.out" '16 features of 5476x1176 bf16 do not fit in a 64 MiB pool'
run steps sync --steps 2 --warmup 2
expect_status "sync: warm-up steps must leave timed ones" $? 2
run onefile report "$tmp/a.json"
expect_status "report takes two or three files" $? 2

# ---- the arithmetic --------------------------------------------------------
PYTHONPATH=$root/tools/bench/engine "$PY" - >"$tmp/arith.out" 2>&1 <<'EOF'
import sys
import engine_bench as e
assert e.image_grid(1024) == (74, 5476, 1176, 1369), e.image_grid(1024)
assert e.image_grid(448) == (32, 1024, 1176, 256)
assert e.image_grid(10) == (2, 4, 1176, 1)  # at least one merge unit
vals = list(range(1, 101))
assert e.percentile(vals, 50) == 50 and e.percentile(vals, 99) == 99 and e.percentile(vals, 100) == 100
assert e.percentile([7], 99) == 7 and e.percentile([], 50) is None
assert e.median([3, 1, 2]) == 2 and e.median([4, 1, 3, 2]) == 2.5
ms = 1_000_000
recs = [{"t_issue": i * 10 * ms, "t_first": i * 10 * ms + (20 + i) * ms, "transport_ns": 2 * ms,
         "batch": i // 2, "gpu_ms": 15.0} for i in range(10)]
s = e.summarize_phase(recs, 0, 1000 * ms)
assert s["requests"] == 10 and abs(s["req_per_s"] - 10.0) < 1e-9, s
assert s["ttft_p50_ms"] == 24 and s["ttft_p99_ms"] == 29, s
assert abs(s["transport_share"] - 0.02) < 1e-9, s           # 10 x 2 ms of 1 s
assert s["batches"] == 5 and abs(s["gpu_busy_share"] - 0.075) < 1e-9, s  # 5 x 15 ms
assert s["mean_batch"] == 2.0
st = e.summarize_steps([100.0, 30.0, 10.0, 20.0], 1)
assert st == {"steps": 3, "step_p50_ms": 20.0, "step_min_ms": 10.0, "step_max_ms": 30.0}, st
ph = e.summarize_phases([{"engine_copy_ms": 99.0}, {"engine_copy_ms": 3.0, "x": 1.0},
                         {"engine_copy_ms": 5.0}, {"engine_copy_ms": 4.0}], 1)
assert ph == {"engine_copy_ms": 4.0, "x": 1.0}, ph
quiet = e.Profile(None, "x")  # no folder: no profiler, torch not even imported
quiet.start(); quiet.stop("n")
assert quiet.prof is None and "torch.profiler" not in sys.modules
chunks = e._sync_chunks([("a", type("T", (), {"numel": lambda s: 3, "element_size": lambda s: 2})())] * 5, 12)
assert [len(c) for c in chunks] == [2, 2, 1], [len(c) for c in chunks]
print("arith: fine")
EOF
expect "image grid, percentiles, a phase's figures, steps, step phases, buckets" "$tmp/arith.out" '^arith: fine$'

# ---- the report on made-up results -------------------------------------------
PYTHONPATH=$root/tools/bench/engine "$PY" - "$tmp" <<'EOF'
import json, sys
d = sys.argv[1]
def phase(cache, load, rps):
    return {"cache": cache, "load": load, "req_per_s": rps, "ttft_p50_ms": 1000 / rps, "ttft_p99_ms": 2000 / rps,
            "transport_p50_ms": 0.5, "transport_mean_ms": 1.0, "transport_share": 0.05, "gpu_busy_share": 0.9}
serve = {"A1": (40.0, 50.0), "B": (49.0, 49.5), "A2": (42.0, 51.0)}
for label, (off, on) in serve.items():
    json.dump({"kind": "serve", "label": label, "results": [
        {"alloc": "expandable", "phases": [phase("off", "burst 8", off), phase("on", "burst 8", on)]}]},
        open(f"{d}/serve_{label}.json", "w"))
sync = {"A1": (100.0, 130.0), "B": (50.0, 55.0), "A2": (110.0, 120.0)}
for label, (leg, exp) in sync.items():
    json.dump({"kind": "sync", "label": label, "results": [
        {"alloc": "legacy", "mode": "tensor", "step_p50_ms": leg,
         "phase_p50_ms": {"engine_deserialize_ms": leg / 10}},
        {"alloc": "expandable", "mode": "tensor", "step_p50_ms": exp}]}, open(f"{d}/sync_{label}.json", "w"))
EOF
run report report "$tmp/serve_A1.json" "$tmp/serve_B.json" "$tmp/serve_A2.json"
expect_status "report: serve files" $? 0
expect "report: a row shows A1 / B / A2" "$tmp/report.out" '^\| expandable \| off \| burst 8 \| 40.0 / \*\*49.0\*\* / 42.0 \| 25 / \*\*20\*\* / 24 \|'
expect "report: cache off against on, with the library" "$tmp/report.out" \
    'expandable, burst 8: with the library, SGLang.s cache off / on = 0.990 \(target: within 5%: met\)'
expect "report: with against the mean without" "$tmp/report.out" 'expandable, cache off, burst 8: with / without \(mean\) = 1.195$'
expect "report: a cell below both runs without is flagged" "$tmp/report.out" \
    'expandable, cache on, burst 8: with / without \(mean\) = 0.980 \(below both runs without\)'
run sreport report "$tmp/sync_A1.json" "$tmp/sync_B.json" "$tmp/sync_A2.json"
expect "report: weight sync rows" "$tmp/sreport.out" '^\| legacy \| per tensor \| 100.0 / \*\*50.0\*\* / 110.0 \| 0.48 \|$'
expect "report: where a step goes, phase by phase" "$tmp/sreport.out" \
    '^\| legacy \| per tensor \| engine deserialize \| 10.0 / \*\*5.0\*\* / 11.0 \|$'
expect "report: a phase not measured shows a dash" "$tmp/sreport.out" \
    '^\| legacy \| per tensor \| engine final sync \| - / \*\*-\*\* / - \|$'
expect "report: expandable against legacy, with the library" "$tmp/sreport.out" \
    'tensor: expandable / legacy, both with the library = 1.10 \(target: at most 1.2: met\)'
ENGINE_TEST_GPUS=0 run nogpu-profile sync --profile-dir "$tmp/prof"
expect "--profile-dir is an option of sync (skipped without a GPU)" "$tmp/nogpu-profile.out" '^engine: skipped: no CUDA GPU'
run mixed report "$tmp/serve_A1.json" "$tmp/sync_B.json"
expect_status "report: serve and sync files together are refused" $? 2

# ---- no GPU, no SGLang -------------------------------------------------------
ENGINE_TEST_GPUS=0 run nogpu serve
expect_status "no GPU: serve exits 0" $? 0
expect "no GPU: serve says it is skipped" "$tmp/nogpu.out" '^engine: skipped: no CUDA GPU'
ENGINE_TEST_GPUS=0 run nogpu-sync sync
expect "no GPU: sync says it is skipped" "$tmp/nogpu-sync.out" '^engine: skipped: no CUDA GPU'
ENGINE_TEST_GPUS=1 run nosglang serve
expect_status "no SGLang files: exit 2" $? 2
expect "no SGLang files: make peer-fetch is named" "$tmp/nosglang.out" 'SGLang.s files are missing: run `make peer-fetch`'
ENGINE_TEST_GPUS=1 run tp2 serve --tp 2
expect "--tp 2 on one GPU: the GPUs needed are named" "$tmp/tp2.out" '^engine: --tp 2 needs 2 GPUs; 1 seen'

# bench.sh's engine part, a GPU but no fetched copy: skipped, said so.
printf '#!/bin/sh\necho "GPU 0: Stand-in (UUID: GPU-0)"\n' >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
: >"$tmp/lib.so"
ENGINE_TEST_GPUS=1 PATH=$tmp/bin:$PATH PYTHONPATH=$tmp/torch PYTHON=$PY NVCC=/bin/false IPCCACHE_LIB=$tmp/lib.so \
    BENCH_PARTS=engine BENCH_OUT=$tmp/res PEER_DIR=$tmp/empty timeout 60 bash "$root/tools/bench/bench.sh" \
    >"$tmp/part.out" 2>&1
expect_status "bench.sh engine part without the fetched copy: exit 0" $? 0
expect "bench.sh engine part without the fetched copy: skipped, make peer-fetch named" "$tmp/part.out" \
    'engine: skipped: no .*/sglang/MANIFEST \(run make peer-fetch'

tap_summary engine-bench
