#!/usr/bin/env bash
#
# test_rl_bench.sh - tests of the RL weight-sync part (tools/bench/rl/rl_bench.py,
# tools/rl_peer/, bench.sh's part rl) without a GPU: the fetched copy's
# manifest check (a missing or changed file stops the run naming `make
# peer-fetch`), the stand-ins, each project's modules importing through them
# (where the fetched copy is here: a stand-in torch plays PyTorch), the
# report's arithmetic on made-up syncs, and the skips: no GPU (exit 77), no
# fetched copy (make peer-fetch named).
#
# Prints "ok - NAME" / "not ok - NAME" per case and ends with the line
# "rl-bench: N passed, M failed, K skipped"; exits non-zero on any failure.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$(dirname "$here")")
BENCH=$root/tools/bench/rl/rl_bench.py
PREPARE=$root/tools/rl_peer/prepare.py
SITE=$root/tools/rl_peer/site
PY=${PYTHON:-python3}
PY=$("$PY" -c 'import sys; print(sys.executable)') || exit 1
FETCHED=${RL_TEST_FETCHED:-$root/.peer/rl}

source "$root/tests/tap.sh"
tap_setup rl-bench
unset PYTORCH_CUDA_ALLOC_CONF BENCH_PARTS BENCH_RL PEER_DIR


# Stand-in torch for the bench's own checks: a GPU or none (RL_TEST_GPUS).
mkdir -p "$tmp/torch/torch" "$tmp/bin" "$tmp/empty"
cat >"$tmp/torch/torch/__init__.py" <<'EOF'
import os
__version__ = "0.0+standin"
class cuda:
    @staticmethod
    def is_available():
        return int(os.environ.get("RL_TEST_GPUS", "0")) > 0
    @staticmethod
    def device_count():
        return int(os.environ.get("RL_TEST_GPUS", "0"))
EOF

run() {  # run NAME ARGS...: the bench with the stand-in torch; output in $tmp/NAME.out
    local name=$1
    shift
    PYTHONPATH=$tmp/torch timeout 60 "$PY" "$BENCH" "$@" >"$tmp/$name.out" 2>&1
}

# ---- arguments, skips -------------------------------------------------------
run case run --cases vllm-tensor,sglang
expect_status "an unknown case is a usage error" $? 2
expect "an unknown case: the cases are named" "$tmp/case.out" \
    "unknown 'sglang' \(choose from vllm-tensor, vllm-packed, verl, openrlhf\)"
run syncs run --syncs 0
expect_status "--syncs 0 is a usage error" $? 2
run onefile report "$tmp/a.json"
expect_status "report takes two or three files" $? 2
RL_TEST_GPUS=0 run nogpu run
expect_status "no GPU: exit 77 (skipped)" $? 77
expect "no GPU: it says it is skipped" "$tmp/nogpu.out" '^rl: skipped: no CUDA GPU'
RL_TEST_GPUS=1 run nofiles run
expect_status "no fetched files: exit 2" $? 2
# shellcheck disable=SC2016  # the backquotes are the message's own
expect "no fetched files: make peer-fetch is named" "$tmp/nofiles.out" \
    'the projects. files are missing: run `make peer-fetch`'

# bench.sh's part rl, a GPU but no fetched copy: skipped, said so.
printf '#!/bin/sh\necho "GPU 0: Stand-in (UUID: GPU-0)"\n' >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
: >"$tmp/lib.so"
RL_TEST_GPUS=1 PATH=$tmp/bin:$PATH PYTHONPATH=$tmp/torch PYTHON=$PY NVCC=/bin/false IPCCACHE_LIB=$tmp/lib.so \
    BENCH_PARTS=rl BENCH_OUT=$tmp/res PEER_DIR=$tmp/empty timeout 60 bash "$root/tools/bench/bench.sh" \
    >"$tmp/part.out" 2>&1
expect_status "bench.sh part rl without the fetched copy: exit 0" $? 0
expect "bench.sh part rl without the fetched copy: skipped, make peer-fetch named" "$tmp/part.out" \
    'rl: skipped: no .*/rl/MANIFEST \(run make peer-fetch'

# ---- the manifest check ------------------------------------------------------
# A made-up fetched copy: the three entry files, an empty deps archive.
mk_fetched() {  # mk_fetched DIR
    local d=$1
    mkdir -p "$d/src/vllm/distributed/weight_transfer" "$d/src/verl/workers/rollout/vllm_rollout" \
        "$d/src/openrlhf/trainer/ray" "$d/deps"
    echo "# stand-in" >"$d/src/vllm/distributed/weight_transfer/ipc_engine.py"
    echo "# stand-in" >"$d/src/verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py"
    echo "# stand-in" >"$d/src/openrlhf/trainer/ray/vllm_worker_wrap.py"
    tar -C "$d/src" -cJf "$d/rl-py.tar.xz" vllm verl openrlhf
    tar -C "$d/deps" -cJf "$d/deps.tar.xz" .
    rm -rf "$d/src" "$d/deps"
    printf 'vllm 0.33.0\n' >"$d/VERSIONS"
    echo "0000  vllm-0.33.0.whl" >"$d/WHEELS"
    (cd "$d" && sha256sum VERSIONS WHEELS rl-py.tar.xz deps.tar.xz >MANIFEST)
}
mk_fetched "$tmp/rl"
"$PY" "$PREPARE" "$tmp/rl" "$tmp/tree" >"$tmp/prep.out" 2>&1
expect_status "prepare: a whole copy unpacks" $? 0
check "prepare: the files are in TREE/src" test -f "$tmp/tree/src/vllm/distributed/weight_transfer/ipc_engine.py"
prep_fail() {  # prep_fail NAME WHAT PATTERN: prepare stops (2) on the broken copy $tmp/rlb, saying PATTERN
    "$PY" "$PREPARE" "$tmp/rlb" "$tmp/treeb" >"$tmp/$1.out" 2>&1
    expect_status "prepare: $2 stops the run (status 2)" $? 2
    expect "prepare: $2 is named" "$tmp/$1.out" "$3"
    # shellcheck disable=SC2016  # the backquotes are the message's own
    expect "prepare: $2: make peer-fetch is named" "$tmp/$1.out" 'make peer-fetch'
    check "prepare: $2: nothing unpacked" test ! -e "$tmp/treeb"
}
cp -r "$tmp/rl" "$tmp/rlb" && rm "$tmp/rlb/deps.tar.xz"
prep_fail missing "a missing file" 'missing .*/rlb/deps.tar.xz \(MANIFEST names it\)'
rm -rf "$tmp/rlb" && cp -r "$tmp/rl" "$tmp/rlb" && echo "verl 0.9.1" >>"$tmp/rlb/VERSIONS"
prep_fail changed "a changed file" 'VERSIONS differs from what MANIFEST says was fetched'
rm -rf "$tmp/rlb" && cp -r "$tmp/rl" "$tmp/rlb" && rm "$tmp/rlb/MANIFEST"
prep_fail nomanifest "no MANIFEST" 'no .*rlb/MANIFEST'
rm -rf "$tmp/rlb" && cp -r "$tmp/rl" "$tmp/rlb" && grep -v ' WHEELS$' "$tmp/rl/MANIFEST" >"$tmp/rlb/MANIFEST"
prep_fail unlisted "a MANIFEST without WHEELS" 'MANIFEST does not name WHEELS'

# ---- the stand-ins (no torch needed) -----------------------------------------
# The fetched tree's folders, empty: the stand-ins sit in its namespace packages.
mkdir -p "$tmp/ns/vllm/config" "$tmp/ns/vllm/v1" "$tmp/ns/verl/workers/rollout" "$tmp/ns/openrlhf/trainer/ray" "$tmp/ns/openrlhf/utils"
PYTHONPATH=$tmp/ns:$SITE "$PY" - >"$tmp/site.out" 2>&1 <<'EOF'
import asyncio, dataclasses
import ray, deepspeed
from vllm.config.utils import config
from vllm.model_executor.model_loader.reload import initialize_layerwise_reload
from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check
from verl.workers.rollout.utils import ensure_async_iterator
from openrlhf.models import Actor
from openrlhf.trainer.ray.launcher import BaseModelActor
from openrlhf.utils.logging_utils import init_logger
from vllm.logger import init_logger as vllm_logger
from vllm.v1.serial_utils import OOBTensorConsumer

@config
class C:
    backend: str = "nccl"
assert dataclasses.is_dataclass(C) and C(backend="ipc").backend == "ipc"
class A: pass
assert ray.remote(A) is A and ray.remote(num_gpus=1)(A) is A
class R:
    def __init__(self, v): self.v = v
    def result(self): return self.v
assert ray.get([R(1), R(2)]) == [1, 2] and ray.get(R(3)) == 3
with deepspeed.zero.GatheredParameters([1], enabled=False):
    pass
try:
    deepspeed.zero.GatheredParameters([1], enabled=True)
    raise SystemExit("ZeRO-3 gathering did not refuse")
except RuntimeError:
    pass
try:
    Actor()
    raise SystemExit("a training name did not raise")
except RuntimeError as exc:
    assert "openrlhf.models.Actor is a stand-in" in str(exc), exc
assert initialize_layerwise_reload(object()) is None
with disable_mtp_completeness_check():
    pass
async def collect(it):
    return [x async for x in ensure_async_iterator(it)]
assert asyncio.run(collect(iter([1, 2]))) == [1, 2]
class BaseChild(BaseModelActor): pass
assert init_logger("x").name == "x" and vllm_logger("vllm.v1.engine.tensor_ipc").name == "vllm.v1.engine.tensor_ipc"
class Sender(OOBTensorConsumer): pass
assert Sender.__mro__[1:] == (OOBTensorConsumer, object)
try:
    import ray.util
    raise SystemExit("a name not listed imported")
except ImportError:
    pass
print("site: fine")
EOF
expect "stand-ins: ray, deepspeed, vLLM's loader hooks and logger, verl's iterator, OpenRLHF's names" "$tmp/site.out" '^site: fine$'

# Each project's modules through the stand-ins, on the fetched copy when it is
# here; PyTorch played by a stand-in that answers any name (importing only).
if [[ -f $FETCHED/MANIFEST ]] && "$PY" "$PREPARE" "$FETCHED" "$tmp/real" >"$tmp/real.out" 2>&1; then
    mkdir -p "$tmp/anytorch"
    cat >"$tmp/anytorch/anytorch.py" <<'EOF'
import importlib.abc, importlib.machinery, sys
from unittest.mock import MagicMock
class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        mod = MagicMock(name=spec.name)
        mod.__path__, mod.__name__, mod.__spec__ = [], spec.name, spec
        return mod
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Finder())
EOF
    imports_ok() {  # imports_ok MODULE: it imports on the fetched tree, output in $tmp/imp.out
        RL_PEER_DEPS=$tmp/real/deps PYTHONPATH=$tmp/real/src:$SITE:$tmp/anytorch \
            "$PY" -c "import anytorch, $1" >"$tmp/imp.out" 2>&1
    }
    for mod in vllm.distributed.weight_transfer.ipc_engine vllm.distributed.weight_transfer.clients \
               vllm.config.weight_transfer vllm.v1.engine.tensor_ipc openrlhf.trainer.ray.ppo_actor openrlhf.trainer.ray.vllm_worker_wrap \
               verl.workers.rollout.vllm_rollout.bucketed_weight_transfer; do
        if [[ $mod == verl.* ]] && ! RL_PEER_DEPS=$tmp/real/deps PYTHONPATH=$SITE "$PY" -c 'import zmq' 2>/dev/null; then
            skip "stand-ins: $mod imports" "pyzmq of the fetched copy is for CPython 3.12 (this is $("$PY" -V))"
            continue
        fi
        TAP_SHOW=$tmp/imp.out check "stand-ins: $mod imports" imports_ok "$mod"
    done
else
    skip "stand-ins: each project's modules import" "no fetched copy at $FETCHED (make peer-fetch; or RL_TEST_FETCHED)"
fi

# ---- the arithmetic and the report -------------------------------------------
PYTHONPATH=$root/tools/bench/rl "$PY" - "$tmp" >"$tmp/arith.out" 2>&1 <<'EOF'
import json, sys
import rl_bench as r
d = sys.argv[1]
G = 1 << 30
assert r.counter_delta(None, {"opens": 3}) is None
assert r.counter_delta({"opens": 5, "hits": 4}, None)["opens"] == 5
delta = r.counter_delta({"opens": 9, "hits": 7, "vmm_maps": 2}, {"opens": 5, "hits": 4})
assert delta["opens"] == 4 and delta["hits"] == 3 and delta["vmm_maps"] == 2 and delta["evictions"] == 0, delta

def recs(steps, free_gib, ok=True, opens=434, hits=0):
    out = []
    for i, s in enumerate(steps):
        out.append({"step_ms": s, "values_ok": ok, "engine_free": free_gib * G + i, "trainer_free": 100 * G,
                    "engine_reserved": 7 * G, "trainer_reserved": 8 * G, "engine_fds": 60, "trainer_fds": 50,
                    "phases": {"rebuild_ms": s / 2, "load_ms": 1.0},
                    "engine_delta": {**dict.fromkeys(r.COUNTERS, 0), "opens": opens, "hits": hits},
                    "engine_stats": {"idle_bytes": G, "ghost_bytes": 0, "live": 0, "idle": 3}})
    return out
s = r.summarize(recs([900.0, 100.0, 300.0, 200.0], 120.0), 1)
assert s["syncs"] == 4 and s["timed"] == 3 and s["step_p50_ms"] == 200.0 and s["step_p99_ms"] == 300.0, s
assert s["values_ok"] and s["bad_syncs"] == [] and abs(s["engine_free_last_gib"] - 120.0) < 1e-6, s
assert s["phase_p50_ms"] == {"load_ms": 1.0, "rebuild_ms": 100.0}, s
assert s["engine_per_sync"]["opens"] == 434 and s["engine_fds"] == [60, 60], s
bad = recs([1.0, 2.0], 120.0)
bad[1]["values_ok"] = False
assert r.summarize(bad, 0)["bad_syncs"] == [1]

def run(label, tensor_ms, free, verl_ms, ok=True):
    res = [{"alloc": "legacy", "case": "vllm-tensor", "error": None,
            "summary": {"busy": r.summarize(recs([tensor_ms] * 3, free, hits=430 if label == "B" else 0), 0)}},
           {"alloc": "legacy", "case": "verl", "error": None,
            "summary": {"busy": r.summarize(recs([verl_ms] * 3, 120.0, ok), 0)}}]
    json.dump({"kind": "rl", "label": label, "results": res}, open(f"{d}/rl_{label}.json", "w"))
import os, types
os.environ["PEER_RECORD"] = f"{d}/results.tsv"
args = types.SimpleNamespace(states=["busy", "idle"])
r.record_outcomes(args, {"alloc": "legacy", "case": "verl", "error": None,
                         "summary": {"busy": r.summarize(recs([1.0], 120.0), 0)}})
r.record_outcomes(args, {"alloc": "expandable", "case": "verl", "error": None,
                         "summary": {"busy": r.summarize(bad, 0)}})
lines = open(f"{d}/results.tsv").read().splitlines()
assert lines == ["rl::legacy::verl::busy\tpassed", "rl::legacy::verl::idle\tfailed",
                 "rl::expandable::verl::busy\tfailed", "rl::expandable::verl::idle\tfailed"], lines
run("A1", 300.0, 120.0, 100.0)
run("B", 100.0, 118.0, 105.0, ok=False)
run("A2", 320.0, 120.0, 101.0)
print("arith: fine")
EOF
expect "counters per sync, a case's summary, bad syncs named, outcomes for make peer" "$tmp/arith.out" '^arith: fine$'
# stats_now asks by the stats signal only once the library has taken it over (its
# first IPC call): before, the signal's default action would end the process.
PYTHONPATH=$root/tools/bench/rl IPCCACHE_STATS_FILE=$tmp/st.%p "$PY" - >"$tmp/sig.out" 2>&1 <<'EOF'
import os, signal
import rl_bench as r
r.library_loaded = lambda: True  # as under the preload
print("before:", r.stats_now())
def write(*_):  # the library's handler: a stats line to its file
    with open(os.environ["IPCCACHE_STATS_FILE"].replace("%p", str(os.getpid())), "a") as f:
        f.write('{"opens": 3, "top": []}\n')
signal.signal(signal.SIGUSR1, write)
print("after:", r.stats_now())
EOF
expect "stats_now: no handler for the stats signal yet: None, the process lives" "$tmp/sig.out" '^before: None$'
expect "stats_now: with the handler: its line" "$tmp/sig.out" "^after: \{'opens': 3\}$"
run report report "$tmp/rl_A1.json" "$tmp/rl_B.json" "$tmp/rl_A2.json"
expect_status "report: three files" $? 0
expect "report: a row shows A1 / B / A2 and the gain" "$tmp/report.out" \
    '^\| vllm-tensor \| legacy \| busy \| 300.0 / \*\*100.0\*\* / 320.0 \| .* \| 3.10x \| same \| 120.00 / \*\*118.00\*\* / 120.00 \|$'
expect "report: the main target, met" "$tmp/report.out" \
    'vLLM per tensor, legacy, forwards in flight: 3.10x faster a step with the library \(target: at least 2.5x: met\)'
expect "report: a cell slower with the library is flagged" "$tmp/report.out" \
    'verl, legacy, busy: slower with the library than a run without \(105.0 ms against 100.0\)'
expect "report: memory past 1% is flagged" "$tmp/report.out" \
    'vllm-tensor, legacy, busy: free memory after the last sync -1.7% with the library \(target: within 1%\)'
expect "report: values that differ are flagged" "$tmp/report.out" \
    '^\| verl \| legacy \| busy \| .* \| DIFFER \|'
expect "report: the library's counters per sync" "$tmp/report.out" \
    '^\| vllm-tensor \| legacy \| busy \| 434 / 430 \| 0 / 0 \| 0 / 0 \| 0 \| 0 / 0 \| 1.00 \| 0.00 \| 60 → 60 \|$'
expect "report: where a sync goes" "$tmp/report.out" '^\| vllm-tensor \| legacy \| busy \| rebuild_ms \| 150.0 / \*\*50.0\*\* / 160.0 \|$'
echo '{"kind": "sync", "results": []}' >"$tmp/other.json"
run mixed report "$tmp/rl_A1.json" "$tmp/other.json"
expect_status "report: another bench's file is refused" $? 2
run mixedtl timeline "$tmp/other.json"
expect_status "timeline: another bench's file is refused" $? 2
run tp0 run --tp 0
expect_status "--tp 0 is a usage error" $? 2

# ---- --tp N: placement, cases, the ranks' answers, their summary ---------------
PYTHONPATH=$root/tools/bench/rl "$PY" - "$tmp" >"$tmp/tp.out" 2>&1 <<'EOF'
import json, os, sys, threading, types
import multiprocessing as mp
import rl_bench as r
d = sys.argv[1]
G = 1 << 30
assert r.rank_gpus(1, 1) == [0] and r.rank_gpus(2, 1) == [0, 0] and r.rank_gpus(2, 2) == [0, 1], "placement"
assert r.rank_gpus(3, 2) == [0, 1, 0] and r.rank_gpus(2, 0) == [0, 0], "placement"
run, skip = r.split_cases(list(r.CASES), [0, 0])
assert run == list(r.CASES) and skip == {}, (run, skip)
run, skip = r.split_cases(list(r.CASES), [0, 1])
assert run == ["verl"] and sorted(skip) == ["openrlhf", "vllm-packed", "vllm-tensor"], (run, skip)
assert "own GPU's UUID" in skip["openrlhf"], skip

# The trainer's fan-out over real pipes: every rank gets the message, each answers.
links, seen = [], []
for rank in range(2):
    mine, theirs = mp.Pipe()
    def serve(conn=theirs, rank=rank):
        msg = conn.recv()
        seen.append((rank, msg))
        conn.send(f"ok {rank}")
    threading.Thread(target=serve, daemon=True).start()
    links.append(r.Link(mine, 10))
assert r.call_all(links, ("begin", True)) == ["ok 0", "ok 1"]
assert sorted(seen) == [(0, ("begin", True)), (1, ("begin", True))], seen

# The ranks' end replies into a record: rank 1 wrong at sync 1.
want = [1, 2, 3]
def end(rank, i, opens):
    stats = {k: 0 for k in r.COUNTERS}
    stats.update(opens=opens * (i + 1), hits=(opens - 1) * (i + 1))
    return {"sums": want if (rank, i) != (1, 1) else [9], "free": (120 + rank) * G, "reserved": 7 * G,
            "fds": 60 + rank, "phases": {"rebuild_ms": 1.0 + rank}, "stats": stats}
prev = [None, None]
recs = []
for i in range(3):
    rec = r.rank_fields(want, [end(0, i, 10), end(1, i, 20)], prev)
    rec.update(step_ms=100.0 + i, trainer_free=100 * G, trainer_reserved=0, trainer_fds=50)
    recs.append(rec)
assert recs[0]["values_ok"] and not recs[1]["values_ok"] and recs[2]["values_ok"], recs
assert recs[1]["ranks"][0]["values_ok"] and not recs[1]["ranks"][1]["values_ok"]
assert recs[2]["engine_delta"]["opens"] == 10 and recs[2]["ranks"][1]["delta"]["opens"] == 20, recs[2]
assert recs[0]["engine_free"] == 120 * G and recs[0]["phases"] == {"rebuild_ms": 1.0}
one = r.rank_fields(want, [end(0, 0, 10)], [None])
assert "ranks" not in one and one["values_ok"], one
one.update(step_ms=1.0, trainer_free=100 * G)
s = r.summarize(recs, 1)
assert s["tp"] == 2 and s["rank_bad_syncs"] == [[], [1]] and s["bad_syncs"] == [1], s
assert s["rank_free_last_gib"] == [120.0, 121.0], s
assert s["rank_per_sync"][1]["opens"] == 20 and s["rank_per_sync"][1]["hits"] == 19, s
assert "tp" not in r.summarize([one], 0)

# The report's files: the same cell three times, a case not run.
for label in ("A1", "B", "A2"):
    json.dump({"kind": "rl", "label": label, "args": {"tp": 2}, "results": [
        {"alloc": "legacy", "case": "verl", "error": None, "summary": {"idle": s}},
        {"alloc": "legacy", "case": "openrlhf", "error": None, "skipped": skip["openrlhf"], "summary": {}}]},
        open(f"{d}/tp_{label}.json", "w"))

# The outcomes for make peer: the tp in the id, a case not run is skipped.
os.environ["PEER_RECORD"] = f"{d}/tp.tsv"
args = types.SimpleNamespace(states=["idle"], tp=2)
r.record_outcomes(args, {"alloc": "legacy", "case": "openrlhf", "error": None, "skipped": "why", "summary": {}})
r.record_outcomes(args, {"alloc": "legacy", "case": "verl", "error": None, "summary": {"idle": s}})
lines = open(f"{d}/tp.tsv").read().splitlines()
assert lines == ["rl::legacy::openrlhf::idle::tp2\tskipped", "rl::legacy::verl::idle::tp2\tfailed"], lines
print("tp: fine")
EOF
expect "tp: placement, the cases a rank off GPU 0 allows, fan-out, every rank's values, its summary, outcomes" \
    "$tmp/tp.out" '^tp: fine$'
run tpreport report "$tmp/tp_A1.json" "$tmp/tp_B.json" "$tmp/tp_A2.json"
expect "tp report: the tp in the case's name" "$tmp/tpreport.out" \
    '^\| verl tp 2 \| legacy \| idle \| 101.0 / \*\*101.0\*\* / 101.0 \|'
expect "tp report: rank 1's counters" "$tmp/tpreport.out" \
    '^\| verl tp 2, rank 1 \| legacy \| idle \| 20 / 19 \| 0 / 0 \| 0 / 0 \| 0 \|'
expect "tp report: a case not run is said, with why" "$tmp/tpreport.out" \
    "^- openrlhf, legacy: not run: an engine rank on GPU 1 looks up the handle of its own GPU's UUID"

# ---- --timeline: the stamps of two processes, the report's arithmetic ---------
# A stand-in torch with the calls the projects make (each a short sleep) and a
# stand-in zmq whose sugar Socket is a Python class over a local socket, as
# pyzmq's is; verl's shape of a sync played by a trainer and an engine process.
mkdir -p "$tmp/tl/torch/multiprocessing" "$tmp/tl/zmq"
cat >"$tmp/tl/torch/__init__.py" <<'EOF'
import time, types
def _nap(ms):
    def call(*a, **kw):
        time.sleep(ms / 1000)
    return call
cuda = types.SimpleNamespace(synchronize=_nap(2), ipc_collect=_nap(1), empty_cache=_nap(30))
accelerator = types.SimpleNamespace(synchronize=_nap(1))
distributed = types.SimpleNamespace(barrier=_nap(1), all_gather_object=_nap(1))
def empty(*a, **kw):
    return bytearray(16)
EOF
cat >"$tmp/tl/torch/multiprocessing/reductions.py" <<'EOF'
def reduce_tensor(t):
    return ("rebuild", (len(t),))
EOF
cat >"$tmp/tl/zmq/__init__.py" <<'EOF'
import pickle
from multiprocessing.connection import Client, Listener
REQ, REP = 3, 4
class Socket:
    def bind(self, path):
        self.conn = Listener(path).accept()
    def connect(self, path):
        self.conn = Client(path)
    def send(self, data):
        self.conn.send_bytes(data)
    def recv(self):
        return self.conn.recv_bytes()
    def send_pyobj(self, obj):
        self.send(pickle.dumps(obj))
    def recv_pyobj(self):
        return pickle.loads(self.recv())
EOF
cat >"$tmp/tl/stamps.py" <<'EOF'
import multiprocessing as mp, os, sys, time
import rl_timeline as tlm
path = os.path.join(sys.argv[1], "tl.sock")

def engine(q):
    import torch, zmq
    rec = tlm.Recorder()
    tlm.install_torch(rec, torch)
    tlm.install_zmq(rec)
    while not os.path.exists(path):
        time.sleep(0.001)
    s = zmq.Socket()
    s.connect(path)
    s.recv_pyobj()                     # the bucket's handle
    s.send(b"")
    torch.cuda.synchronize()
    s.recv_pyobj()                     # the last bucket
    torch.cuda.empty_cache()
    s.send(b"")
    q.put(rec.take())

if __name__ == "__main__":  # the trainer; spawn imports this file in the engine
    import torch, zmq
    rec = tlm.Recorder()
    tlm.install_torch(rec, torch)
    tlm.install_zmq(rec)
    assert not rec.wrap(torch.cuda, "synchronize"), "wrapped twice"
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=engine, args=(q,))
    p.start()
    t0 = time.monotonic_ns()
    s = zmq.Socket()
    s.bind(path)
    buf = torch.empty(1 << 31)             # not wrapped: torch's device context knows it by identity
    import torch.multiprocessing.reductions as red
    s.send_pyobj(red.reduce_tensor(buf))
    s.recv()
    for _ in range(3):
        red.reduce_tensor(buf)
    torch.cuda.synchronize()
    s.send_pyobj({"is_last": True})
    s.recv()
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    rec.add("sync", t0)
    trainer = rec.take()
    eng = q.get(timeout=30)
    p.join(30)
    names = [e[0] for e in trainer]
    assert getattr(torch.empty, "_rl_timeline", False) is False
    assert names == ["sync", "reduce_tensor", "zmq.send_pyobj", "zmq.recv", "reduce_tensor",
                     "cuda.synchronize",
                     "zmq.send_pyobj", "zmq.recv", "cuda.ipc_collect", "cuda.empty_cache"], names
    assert [e[0] for e in eng] == ["zmq.recv_pyobj", "zmq.send", "cuda.synchronize", "zmq.recv_pyobj",
                                   "cuda.empty_cache", "zmq.send"], eng
    for spans in (trainer[1:], eng):
        assert all(a[1] <= a[2] <= b[1] for a, b in zip(spans, spans[1:])), spans   # in order, none overlapping
    red3 = trainer[4]
    assert red3[3] == 3 and 0 < red3[4] <= red3[2] - red3[1], red3   # three in a row: one entry, their time summed
    # One clock: the engine's first receive ends after the trainer's send began; its
    # last send (the ack) ends after the trainer's last receive began.
    assert eng[0][2] >= trainer[2][1] and eng[-1][2] >= trainer[7][1], (eng, trainer)
    assert trainer[-1][2] - trainer[-1][1] >= 30e6, trainer[-1]
    print("stamps: fine")
EOF
PYTHONPATH=$root/tools/bench/rl:$tmp/tl timeout 60 "$PY" "$tmp/tl/stamps.py" "$tmp" >"$tmp/tl.out" 2>&1
expect "timeline: two processes' stamps in order on one clock, nested zmq calls once, runs collapsed" \
    "$tmp/tl.out" '^stamps: fine$'

PYTHONPATH=$root/tools/bench/rl "$PY" - "$tmp" >"$tmp/tlr.out" 2>&1 <<'EOF'
import json, sys
import rl_timeline as tlm
d = sys.argv[1]
M = 1_000_000  # ns per ms
def sync(t0, cleanup_ms, recv_ms):
    # trainer: its sync, 434 reduce_tensor, its cleanup's empty_cache; engine: a long receive
    return {"t0": t0,
            "trainer": [["sync", t0, t0 + 100 * M, 1, 100 * M],
                        ["reduce_tensor", t0 + 1 * M, t0 + 5 * M, 434, 3 * M],
                        ["cuda.empty_cache", t0 + 60 * M, t0 + (60 + cleanup_ms) * M, 1, cleanup_ms * M]],
            "engines": [[["zmq.recv_pyobj", t0 + 50 * M, t0 + (50 + recv_ms) * M, 1, recv_ms * M],
                         ["zmq.send", t0 + 99 * M, t0 + 100 * M, 1, M]]]}
tls = [sync(10**12, 30, 45), sync(2 * 10**12, 40, 48), sync(3 * 10**12, 35, 20)]
rows = tlm.median_timeline(tls)
got = {(r["proc"], r["name"]): r for r in rows}
e = got[("trainer", "cuda.empty_cache")]
assert e["start"] == 60.0 and e["ms"] == 35.0 and e["seen"] == 3, e
assert got[("trainer", "reduce_tensor")]["count"] == 434 and got[("engine", "zmq.recv_pyobj")]["ms"] == 45.0, rows
assert [r["name"] for r in rows][:2] == ["sync", "reduce_tensor"], rows
m = tlm.meanwhile(rows, e, "engine")
assert m["name"] == "zmq.recv_pyobj", m    # 60..95 against 50..95: the receive covers it
assert tlm.meanwhile(rows, got[("trainer", "reduce_tensor")], "engine") is None
# An event seen in fewer than half the syncs is left out.
tls[0]["engines"][0].append(["cuda.synchronize", 10**12 + 10 * M, 10**12 + 12 * M, 1, 2 * M])
assert ("engine", "cuda.synchronize") not in {(r["proc"], r["name"]) for r in tlm.median_timeline(tls)}
recs = [{"timeline": t} for t in tls]
json.dump({"kind": "rl", "label": "B", "args": {"warmup": 1, "tp": 1},
           "results": [{"case": "verl", "alloc": "legacy", "records": {"idle": [{"step_ms": 1}] + recs}}]},
          open(f"{d}/tl_B.json", "w"))
print("timeline arithmetic: fine")
EOF
expect "timeline: median offsets and lengths, matched across syncs, what the other process was in" \
    "$tmp/tlr.out" '^timeline arithmetic: fine$'
run tlreport timeline "$tmp/tl_B.json"
expect_status "timeline: the report runs" $? 0
expect "timeline: a cell's title, the syncs after the warmup" "$tmp/tlreport.out" \
    '^### B verl, legacy, idle: the median sync of 3, ms from its start$'
expect "timeline: a row per event, in its process's column, a run's count" "$tmp/tlreport.out" \
    '^\| 1.0 \| 4.0 \| reduce_tensor x434 \|  \|$'
expect "timeline: what the engine was in during the trainer's empty_cache" "$tmp/tlreport.out" \
    '^- trainer cuda.empty_cache 35.0 ms \(from 60.0\) while engine in zmq.recv_pyobj \(45.0 ms from 50.0\)$'
expect "timeline: nothing recorded in the other process is said" "$tmp/tlreport.out" \
    '^- trainer reduce_tensor x434 4.0 ms \(from 1.0\) while engine in no recorded call$'
run tlnone timeline "$tmp/rl_B.json"
expect "timeline: a run without --timeline is said" "$tmp/tlnone.out" 'no timeline in these files \(run with --timeline\)'

tap_summary rl-bench
