#!/usr/bin/env python3
"""RL weight sync with vLLM's, verl's and OpenRLHF's own released code.

What is each project's code and what is this bench's:
  vLLM 0.33 (vllm/distributed/weight_transfer/, imported, never changed):
    the trainer's IPCTrainerWeightTransferEngine (trainer_init, send_weights:
    reduce_tensor per parameter, or packed_ipc_producer's 1 GiB buffer with
    packed=True), its HTTPVLLMWeightSyncClient (the handles pickled and
    base64-encoded, as over HTTP), ModuleSource over the trainer's model; the
    engine's IPCWeightTransferEngine (init_transfer_engine, start_, update_,
    finish_weight_update: receive_weights rebuilds every tensor, or the packed
    buffer through PackedBufferImporter, then calls load_weights once).
  verl 0.9.1 (verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py):
    BucketedWeightSender (a fresh bucket every sync, ZMQ, its ipc_collect and
    empty_cache) and BucketedWeightReceiver (rebuild, callback per bucket, its
    cleanup), as its vLLM rollout uses them (update_weights_from_ipc).
  OpenRLHF 0.11.2: ActorPPOTrainer.broadcast_to_vllm of
    openrlhf/trainer/ray/ppo_actor.py (per parameter clone + reduce_tensor,
    all_gather_object, one engine call each, barrier + cuda sync; empty_cache
    before and after) and WorkerWrap.update_weight_cuda_ipc of
    vllm_worker_wrap.py (rebuild, load_weights, cuda synchronize).
  This bench's: the two processes and the pipe between them (standing for
  HTTP, Ray and the engine's RPC), the endpoint that calls the engine-side
  methods, the engine's model (Qwen2.5-3B's shapes, random bf16, loaded by a
  load_weights that copies each received tensor into its parameter), the
  forwards it keeps in flight (tools/bench/engine/engine_bench.py's CUDA
  graphs), the trainer's change of every weight before each sync, the
  checksums, memory and counters per sync. tools/rl_peer/site stands in for
  what the projects import but the weight sync never calls.

Cases: vllm-tensor (vLLM's default, packed=False), vllm-packed, verl,
openrlhf; each with the engine busy (forwards enqueued at the start of each
sync) and idle. One trainer and one engine process per allocator run every
case in turn, as an RL job syncs again and again.

usage:
  rl_bench.py run [options]      the cases; exit 1 when one failed or a value
                                 differed from the trainer's
  rl_bench.py report A1 B A2     Markdown tables from the --out files of the
                                 runs without / with / without the library
  rl_bench.py timeline FILE...   each case's median sync in every process, on
                                 one clock, from runs made with --timeline

--tp N: N engine ranks, each its own process rebuilding every tensor and
loading it into its own model copy, as TP ranks do; rank r on GPU r modulo
the GPUs visible. The projects feed several ranks from several trainer ranks,
one colocated with each (vLLM's and OpenRLHF's handles are keyed by the GPU's
UUID, verl opens one ZMQ pair per GPU), each its own export of every tensor
(PyTorch's cross-process refcount pairs one export with one consumer). Here
one trainer, on GPU 0, plays each rank's trainer in turn: per sync the
project's sender runs once per engine rank, to that rank only. A step is
those N sends. vLLM's and OpenRLHF's cases need every rank on GPU 0 (they
look up their own GPU's UUID); with ranks on other GPUs only verl runs
(rebuild_ipc sets the receiver's device index: cross-GPU opens of GPU 0's
memory).
The library is not chosen here: run the whole command without and with
LD_PRELOAD (tools/bench/bench.sh, BENCH_PARTS=rl, does A/B/A). The projects'
files must be importable: bench.sh unpacks `make peer-fetch`'s copy and puts
it on PYTHONPATH with tools/rl_peer/site.
Exit status: 0 done, 1 a run failed, 2 a usage error or the files are
missing, 77 skipped (no CUDA GPU).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_bench as eb  # noqa: E402  (the engine bench: model, forwards, arithmetic)
import rl_timeline as tlm  # noqa: E402  (--timeline: the spans, their wrappers, their report)

CASES = ("vllm-tensor", "vllm-packed", "verl", "openrlhf")
STATES = ("busy", "idle")
# The library's counters shown per sync (differences of its stats lines).
COUNTERS = ("opens", "hits", "vmm_imports", "vmm_import_hits", "vmm_maps", "vmm_map_hits",
            "evictions", "releases_on_request")
# Levels shown as they are after a sync.
LEVELS = ("idle_bytes", "ghost_bytes", "live", "idle")
MODEL_NAMES = {"qwen2.5-3b": "qwen2.5-vl-3b", "tiny": "tiny"}  # engine_bench's MODELS, text part
GIB = float(1 << 30)
# The cases whose engine side picks its handle by its own GPU's UUID (vLLM's
# IPC engine, OpenRLHF's update_weight_cuda_ipc): a rank on another GPU than
# the one trainer's finds none. verl's rebuild_ipc only sets the device index.
UUID_KEYED = ("vllm-tensor", "vllm-packed", "openrlhf")
# This process's timeline recorder (--timeline), else None.
REC = None


def note(msg):
    print(f"rl: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- arithmetic (no torch)

def counter_delta(line, prev):
    """Each counter's increase from the stats line `prev` (None: the
    process's start) to `line`; None without a line."""
    if not line:
        return None
    prev = prev or {}
    return {k: line.get(k, 0) - prev.get(k, 0) for k in COUNTERS}


def rank_gpus(tp, gpus):
    """Engine rank r's GPU: r modulo the GPUs visible (the trainer is on 0),
    so two ranks share one GPU where one is lent."""
    return [r % max(gpus, 1) for r in range(tp)]


def split_cases(cases, gpus_of_ranks):
    """The cases that can run with the engine ranks on these GPUs, and the
    others with the reason: one trainer on GPU 0 sends the handles of GPU 0
    only, which an engine side keyed by its own GPU's UUID cannot use."""
    off = sorted({g for g in gpus_of_ranks if g != 0})
    if not off:
        return list(cases), {}
    why = (f"an engine rank on GPU {','.join(map(str, off))} looks up the handle of its own GPU's UUID; "
           "the one trainer, on GPU 0, sends GPU 0's only")
    return [c for c in cases if c not in UUID_KEYED], {c: why for c in cases if c in UUID_KEYED}


def rank_fields(want, ends, prev):
    """The engine ranks' replies at a sync's end -> the record's engine
    fields: rank 0's as the engine's (as with one rank); with more, every
    rank's in "ranks". prev: each rank's last stats line, updated."""
    fields = {"values_ok": all(e["sums"] == want for e in ends)}
    ranks = []
    for r, e in enumerate(ends):
        ranks.append({"values_ok": e["sums"] == want, "free": e["free"], "fds": e["fds"],
                      "phases": e["phases"], "delta": counter_delta(e["stats"], prev[r]),
                      "stats": e["stats"]})
        prev[r] = e["stats"] or prev[r]
    first = ranks[0]
    fields.update({"engine_delta": first["delta"], "engine_free": first["free"],
                   "engine_reserved": ends[0]["reserved"], "engine_fds": first["fds"],
                   "phases": first["phases"], "engine_stats": first["stats"]})
    if len(ends) > 1:
        fields["ranks"] = [{k: v for k, v in rk.items() if k != "stats"} for rk in ranks]
    return fields


def summarize_ranks(records, warmup):
    """Per engine rank (--tp > 1): its bad syncs, free memory after the last
    sync, the library's counters per sync (median)."""
    n = len(records[0]["ranks"])
    out = {"tp": n, "rank_bad_syncs": [], "rank_free_last_gib": [], "rank_per_sync": []}
    for r in range(n):
        mine = [rec["ranks"][r] for rec in records]
        out["rank_bad_syncs"].append([i for i, m in enumerate(mine) if not m["values_ok"]])
        out["rank_free_last_gib"].append(mine[-1]["free"] / GIB)
        got = [m["delta"] for m in mine[warmup:] if m["delta"]]
        out["rank_per_sync"].append({k: eb.median([d[k] for d in got]) for k in COUNTERS} if got else None)
    return out


def summarize(records, warmup):
    """One case x engine state: records are the syncs in order, each a dict
    with step_ms, values_ok, engine/trainer free bytes, phases, stats."""
    timed = records[warmup:]
    steps = sorted(r["step_ms"] for r in timed)
    deltas = [r.get("engine_delta") for r in timed]
    tdeltas = [r.get("trainer_delta") for r in timed]
    last = records[-1] if records else {}
    free = [r["engine_free"] for r in records]
    out = {
        "syncs": len(records), "timed": len(timed),
        "step_p50_ms": eb.percentile(steps, 50), "step_p99_ms": eb.percentile(steps, 99),
        "values_ok": all(r["values_ok"] for r in records) and bool(records),
        "bad_syncs": [i for i, r in enumerate(records) if not r["values_ok"]],
        "engine_free_last_gib": last.get("engine_free", 0) / GIB if records else None,
        "trainer_free_last_gib": last.get("trainer_free", 0) / GIB if records else None,
        "engine_free_span_gib": (max(free) - min(free)) / GIB if free else None,
        "engine_reserved_last_gib": last.get("engine_reserved", 0) / GIB if records else None,
        "trainer_reserved_last_gib": last.get("trainer_reserved", 0) / GIB if records else None,
        "engine_fds": [records[0]["engine_fds"], last["engine_fds"]] if records else None,
        "phase_p50_ms": {k: eb.median([r["phases"][k] for r in timed if k in r.get("phases", {})])
                         for k in sorted({k for r in timed for k in r.get("phases", {})})},
    }
    for side, ds in (("engine", deltas), ("trainer", tdeltas)):
        got = [d for d in ds if d]
        if got:
            out[f"{side}_per_sync"] = {k: eb.median([d[k] for d in got]) for k in COUNTERS}
    stats = last.get("engine_stats") if records else None
    if stats:
        out["engine_levels_last"] = {k: stats.get(k) for k in LEVELS}
    if records and records[0].get("ranks"):
        out.update(summarize_ranks(records, warmup))
    return out


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _trio(vals, spec):
    shown = [_fmt(v, spec) for v in vals]
    if len(shown) >= 2:
        shown[1] = f"**{shown[1]}**"
    return " / ".join(shown)


def _cells(runs):
    """(case, alloc, state) -> [summary per run], only cells every run has."""
    cells = {}
    for run in runs:
        for r in run["results"]:
            for state, s in (r.get("summary") or {}).items():
                case = r["case"] + (f" tp {s['tp']}" if s.get("tp", 1) > 1 else "")
                cells.setdefault((case, r["alloc"], state), []).append(s)
    return {k: v for k, v in cells.items() if len(v) == len(runs)}


def _without_mean(vals):
    rest = [v for i, v in enumerate(vals) if i != 1 and v is not None]
    return sum(rest) / len(rest) if rest else None


def report(runs):
    cells = _cells(runs)
    lines = ["| case | allocator | engine | step p50 ms without / **with** / without | step p99 ms "
             "| without / with (p50) | values | engine free after the last sync, GiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    targets = []
    for (case, alloc, state), ss in sorted(cells.items()):
        p50 = [s["step_p50_ms"] for s in ss]
        gain = eb._ratio(_without_mean(p50), p50[1]) if len(ss) >= 2 else None
        values = "same" if all(s["values_ok"] for s in ss) else "DIFFER"
        lines.append(f"| {case} | {alloc} | {state} | {_trio(p50, '.1f')} "
                     f"| {_trio([s['step_p99_ms'] for s in ss], '.1f')} | {_fmt(gain, '.2f')}x | {values} "
                     f"| {_trio([s['engine_free_last_gib'] for s in ss], '.2f')} |")
        if len(ss) < 2:
            continue
        rest = [v for i, v in enumerate(p50) if i != 1]
        if p50[1] is not None and rest and p50[1] > min(rest):
            targets.append(f"- {case}, {alloc}, {state}: slower with the library than a run without "
                           f"({p50[1]:.1f} ms against {min(rest):.1f})")
        free = [s["engine_free_last_gib"] for s in ss]
        base = _without_mean(free)
        if base and free[1] is not None:
            diff = (free[1] - base) / base * 100
            if abs(diff) > 1:
                targets.append(f"- {case}, {alloc}, {state}: free memory after the last sync "
                               f"{diff:+.1f}% with the library (target: within 1%)")
        if not all(s["values_ok"] for s in ss):
            targets.append(f"- {case}, {alloc}, {state}: a received weight differed from the trainer's")
    main = cells.get(("vllm-tensor", "legacy", "busy"))
    if main and len(main) >= 2:
        g = eb._ratio(_without_mean([s["step_p50_ms"] for s in main]), main[1]["step_p50_ms"])
        targets.insert(0, f"- vLLM per tensor, legacy, forwards in flight: {_fmt(g, '.2f')}x faster a step "
                          f"with the library (target: at least 2.5x: {'met' if g and g >= 2.5 else 'missed'})")
    if len(runs) >= 2 and not [t for t in targets if "slower" in t]:
        targets.append("- no cell slower with the library than a run without")
    skipped = {(r["case"], r["alloc"]): r["skipped"] for run in runs for r in run["results"] if r.get("skipped")}
    targets += [f"- {case}, {alloc}: not run: {why}" for (case, alloc), why in sorted(skipped.items())]
    lines += ["", *targets, "", *report_phases(cells), *report_library(cells)]
    return "\n".join(lines)


def report_phases(cells):
    rows = []
    for (case, alloc, state), ss in sorted(cells.items()):
        for k in sorted({k for s in ss for k in s["phase_p50_ms"]}):
            rows.append(f"| {case} | {alloc} | {state} | {k} | "
                        f"{_trio([s['phase_p50_ms'].get(k) for s in ss], '.1f')} |")
    if not rows:
        return []
    return ["Where a sync goes in the engine (host ms, median of the timed syncs): rebuild is PyTorch's "
            "rebuild_cuda_tensor (the IPC open), load the bench's load_weights (the copies' enqueue), "
            "handler the project's receive call in all, of which the rest is release, its synchronizes "
            "and its cleanup; forwards_gpu the forwards in flight, device time.", "",
            "| case | allocator | engine | phase | without / **with** / without |",
            "| --- | --- | --- | --- | --- |", *rows, ""]


def _counts(d):
    return (f"{d['opens']:g} / {d['hits']:g} | {d['vmm_imports']:g} / {d['vmm_import_hits']:g} "
            f"| {d['vmm_maps']:g} / {d['vmm_map_hits']:g} | {d['evictions']:g}")


def report_library(cells):
    rows = []
    for (case, alloc, state), ss in sorted(cells.items()):
        if len(ss) < 2 or "engine_per_sync" not in ss[1]:
            continue
        d, t = ss[1]["engine_per_sync"], ss[1].get("trainer_per_sync") or {}
        lv = ss[1].get("engine_levels_last") or {}
        fds = ss[1].get("engine_fds") or [None, None]
        rows.append(f"| {case} | {alloc} | {state} | {_counts(d)} "
                    f"| {d['releases_on_request']:g} / {t.get('releases_on_request', 0):g} "
                    f"| {_fmt((lv.get('idle_bytes') or 0) / GIB, '.2f')} | {_fmt((lv.get('ghost_bytes') or 0) / GIB, '.2f')} "
                    f"| {fds[0]} → {fds[1]} |")
        for r, rd in enumerate(ss[1].get("rank_per_sync") or []):
            if r and rd:
                rows.append(f"| {case}, rank {r} | {alloc} | {state} | {_counts(rd)} "
                            f"| {rd['releases_on_request']:g} / - | - | - | - |")
    if not rows:
        return []
    return ["The library in the engine, per sync (median of the timed syncs, the run with it); idle and ghost "
            "bytes after the last sync; the engine's open fds at the first and the last sync:", "",
            "| case | allocator | engine | opens / hits | VMM imports / hits | VMM maps / hits | evictions "
            "| releases on request (engine / trainer) | idle GiB | ghost GiB | fds |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""]


# ----------------------------------------------------------------- arguments

def parse_args(argv):
    p = argparse.ArgumentParser(prog="rl_bench.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--cases", type=eb._choices("--cases", CASES), default=list(CASES))
    r.add_argument("--allocs", type=eb._choices("--allocs", eb.ALLOCS), default=list(eb.ALLOCS))
    r.add_argument("--states", type=eb._choices("--states", STATES), default=list(STATES),
                   help="busy: the engine's forwards in flight during each sync; idle: none")
    r.add_argument("--model", choices=sorted(MODEL_NAMES), default="qwen2.5-3b")
    r.add_argument("--syncs", type=eb._positive("--syncs"), default=20, help="timed syncs per case and state")
    r.add_argument("--warmup", type=int, default=2, help="untimed syncs first (values still checked)")
    r.add_argument("--forwards", type=int, default=4, help="forwards enqueued at the start of a busy sync")
    r.add_argument("--bucket-mb", type=eb._positive("--bucket-mb"), default=2048,
                   help="verl's bucket (update_weights_bucket_megabytes, its default 2048)")
    r.add_argument("--packed-mb", type=eb._positive("--packed-mb"), default=1024,
                   help="vLLM's packed buffer (DEFAULT_PACKED_BUFFER_SIZE_BYTES: 1 GiB)")
    r.add_argument("--tp", type=eb._positive("--tp"), default=1,
                   help="engine ranks, each its own process rebuilding every tensor, rank r on GPU r %% GPUs; "
                        "one trainer (GPU 0) sends to each in turn")
    r.add_argument("--timeline", action="store_true",
                   help="record each sync's steps and library calls in every process (rl_bench.py timeline)")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds per allocator")
    r.add_argument("--out", help="write the results as JSON here")
    r.add_argument("--label", default="", help="a name for this run in the report (A1, B, A2)")
    rep = sub.add_parser("report")
    rep.add_argument("files", nargs="+", help="without, with[, without again]")
    tl = sub.add_parser("timeline", help="each case's median sync, from runs made with --timeline")
    tl.add_argument("files", nargs="+")
    tl.add_argument("--min-ms", type=float, default=1.0,
                    help="say what the other processes did during each event at least this long")
    args = p.parse_args(argv)
    if args.cmd == "run" and (args.warmup < 0 or args.forwards < 0):
        p.error("--warmup and --forwards must not be negative")
    if args.cmd == "report" and not 2 <= len(args.files) <= 3:
        p.error("report takes two or three files")
    return args


def require_projects():
    """The three projects' files importable, else exit 2 naming make peer-fetch."""
    import importlib.util
    missing = [m for m in ("vllm.distributed.weight_transfer.ipc_engine",
                           "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer",
                           "openrlhf.trainer.ray.vllm_worker_wrap")
               if not _findable(importlib.util, m)]
    if missing:
        print("rl: the projects' files are missing: run `make peer-fetch` on a machine with the network, "
              f"then `BENCH_PARTS=rl make bench` (it unpacks them); not found: {', '.join(missing)}",
              file=sys.stderr)
        sys.exit(2)


def _findable(util, name):
    try:
        return util.find_spec(name) is not None
    except ImportError:
        return False


# ----------------------------------------------------------------- per-process measures

def library_loaded():
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            return "libipccache" in f.read()
    except OSError:
        return False


def stats_signal(setting):
    """The library's stats signal for IPCCACHE_STATS_SIGNAL (unset: SIGUSR1),
    None for 0 or a form this bench does not read (then no stats per sync)."""
    import signal
    text = setting.strip().upper()
    if not text:
        return signal.SIGUSR1
    if text.isdigit():
        return int(text) or None
    name = text if text.startswith("SIG") else "SIG" + text
    return getattr(signal, name, None)


def signal_caught(signo):
    """Whether this process has a handler for signo (/proc/self/status's
    SigCgt): the library takes its stats signal over only at the first IPC
    call; before, the signal would end the process."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            caught = next((int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:")), 0)
    except (OSError, ValueError):
        return False
    return bool(caught >> (signo - 1) & 1)


def stats_now():
    """The library's stats line written now (its stats signal to this
    process), or None without the library, its handler or a %p stats file."""
    template = os.environ.get("IPCCACHE_STATS_FILE", "")
    signo = stats_signal(os.environ.get("IPCCACHE_STATS_SIGNAL", ""))
    if "%p" not in template or not signo or not library_loaded() or not signal_caught(signo):
        return None
    path = template.replace("%p", str(os.getpid()))

    def count():
        try:
            with open(path, encoding="utf-8") as f:
                return sum(1 for ln in f if ln.startswith("{"))
        except OSError:
            return 0
    before = count()
    os.kill(os.getpid(), signo)
    deadline = time.monotonic() + 2.0
    while count() <= before and time.monotonic() < deadline:
        time.sleep(0.001)
    line = eb.read_stats(os.getpid())
    if line:
        line.pop("top", None)
    return line


def open_fds():
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def build_model(torch, args, device="cuda:0"):
    transformers = eb.real_transformers()
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen2ForCausalLM._from_config(
            transformers.Qwen2Config(**eb.MODELS[MODEL_NAMES[args.model]]["text"]), dtype=torch.bfloat16)
    return model


def checksums(torch, named):
    """Two exact sums per tensor of its bits: all of them, and every 7th (a
    moved value shows); on the GPU, one transfer."""
    sums = []
    for _, t in named:
        bits = t.detach().reshape(-1).view(torch.int16)
        sums.append(bits.sum(dtype=torch.int64))
        sums.append(bits[::7].sum(dtype=torch.int64))
    return torch.stack(sums).tolist()


def init_dist(torch, name):
    """A process group of one (OpenRLHF's code asks its rank, gathers and
    waits at barriers, as over its trainer ranks)."""
    import tempfile
    if not torch.distributed.is_initialized():
        path = os.path.join(tempfile.mkdtemp(prefix=f"rl-{name}-"), "store")
        torch.distributed.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)


# ----------------------------------------------------------------- engine

class Loader:
    """The engine's model as the projects' receivers see it: load_weights
    copies each received tensor into the parameter of that name (vLLM's
    models do the same for unfused names), timed."""

    def __init__(self, params, clock):
        self.params, self.clock = params, clock

    def load_weights(self, weights):
        import torch
        t0 = time.perf_counter_ns()
        m0 = time.monotonic_ns() if REC else 0
        with torch.no_grad():
            for name, w in weights:
                self.params[name].copy_(w)
        self.clock["load"] += time.perf_counter_ns() - t0
        if REC:
            REC.add("load_weights", m0)
        return set(n for n, _ in weights)


def timed_rebuild(clock):
    """PyTorch's rebuild_cuda_tensor (the IPC open), wrapped in place before
    the projects import it: each one's receive calls it by that name."""
    import torch.multiprocessing.reductions as red
    real = red.rebuild_cuda_tensor

    def rebuild_cuda_tensor(*args, **kwargs):
        t0 = time.perf_counter_ns()
        m0 = time.monotonic_ns() if REC else 0
        try:
            return real(*args, **kwargs)
        finally:
            clock["rebuild"] += time.perf_counter_ns() - t0
            if REC:
                REC.add("rebuild_cuda_tensor", m0)
    red.rebuild_cuda_tensor = rebuild_cuda_tensor


def start_timeline(args, torch):
    """This process's recorder and torch's and zmq's wrappers (--timeline),
    before the projects import."""
    global REC
    if args.timeline:
        REC = tlm.Recorder()
        tlm.install_torch(REC, torch)
        tlm.install_zmq(REC)


def timeline_verl():
    if REC:
        from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as mod
        tlm.install_verl(REC, mod)


def engine_main(args, conn, gpu=0):
    import types
    import torch
    try:
        torch.cuda.set_device(gpu)
        device = torch.device(f"cuda:{gpu}")
        clock = {"rebuild": 0, "load": 0, "handler": 0}
        start_timeline(args, torch)
        timed_rebuild(clock)
        model = build_model(torch, args, device)
        model.eval()
        named = list(model.named_parameters())
        loader = Loader(dict(named), clock)
        ids = torch.randint(1000, 100000, (8, 256), device=device)
        graph = eb.capture_forward(torch, model, ids) if args.forwards else None
        fwd = torch.cuda.Stream()
        ev = [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
        init_dist(torch, "engine")
        handlers = engine_handlers(args, torch, loader, device, types)
        timeline_verl()
        conn.send(("ready", os.getpid(), gpu))
        busy = False
        while True:
            msg = conn.recv()
            if msg is None:
                break
            kind = msg[0]
            if kind == "begin":
                busy = msg[1]
                m0 = time.monotonic_ns()
                for k in clock:
                    clock[k] = 0
                if REC:
                    REC.take()  # what came before this sync
                if busy:
                    fwd.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(fwd), torch.inference_mode():
                        ev[0].record()
                        for _ in range(args.forwards):
                            if graph is not None:
                                graph.replay()
                            else:
                                model(input_ids=ids, use_cache=False, logits_to_keep=1)
                        ev[1].record()
                if REC:
                    REC.add("begin (forwards enqueued)" if busy else "begin", m0)
                conn.send("ok")
            elif kind == "end":
                spans = REC.take() if REC else None
                fwd.synchronize()
                torch.cuda.synchronize()
                phases = {k + "_ms": v / 1e6 for k, v in clock.items()}
                phases["rest_ms"] = phases["handler_ms"] - phases["rebuild_ms"] - phases["load_ms"]
                if busy:
                    phases["forwards_gpu_ms"] = ev[0].elapsed_time(ev[1])
                free, _ = torch.cuda.mem_get_info()
                conn.send({"sums": checksums(torch, named), "free": free,
                           "reserved": torch.cuda.memory_reserved(), "stats": stats_now(),
                           "fds": open_fds(), "phases": phases, "timeline": spans})
            else:
                t0 = time.perf_counter_ns()
                m0 = time.monotonic_ns() if REC else 0
                try:
                    handlers[kind](*msg[1:])
                    reply = "ok"
                except Exception as exc:  # noqa: BLE001  (said to the trainer, which stops)
                    reply = f"error: {type(exc).__name__}: {exc}"
                clock["handler"] += time.perf_counter_ns() - t0
                if REC:
                    REC.add(f"handler {kind}" + (f" {msg[1]}" if kind == "vllm" else ""), m0)
                conn.send(reply)
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as exc:  # noqa: BLE001
        try:
            conn.send(("error", f"engine: {type(exc).__name__}: {exc}"))
        except OSError:
            pass
        raise


def engine_handlers(args, torch, loader, device, types):
    """The engine side of each project, called with what the trainer sent."""
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
    from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

    vllm_config = types.SimpleNamespace(parallel_config=None, model_config=None)
    vllm = IPCWeightTransferEngine(WeightTransferConfig(backend="ipc"), vllm_config, device, loader)
    worker = WorkerWrap()
    worker.model_config = types.SimpleNamespace(dtype=torch.bfloat16)
    worker.device = device
    worker.model_runner = types.SimpleNamespace(model=loader)

    # vLLM's RL routes (api_router.py): what each HTTP path calls on the engine.
    def vllm_route(path, body):
        body = body or {}
        if path == "init_weight_transfer_engine":
            vllm.init_transfer_engine(vllm.parse_init_info(body["init_info"]))
        elif path == "start_weight_update":
            vllm.start_weight_update()
        elif path == "update_weights":
            vllm.update_weights(body["update_info"])
        elif path == "finish_weight_update":
            vllm.finish_weight_update()
        else:
            raise ValueError(f"no route {path}")

    # verl's update_weights_from_ipc (vllm_rollout/utils.py): a receiver per
    # sync, each bucket to load_weights.
    def verl_receive(zmq_handle):
        receiver = BucketedWeightReceiver(zmq_handle=zmq_handle, device=device, use_shm=False)
        receiver.receive_weights(on_bucket_received=lambda weights, is_last: loader.load_weights(weights))

    def openrlhf_call(call_args, call_kwargs):
        worker.update_weight_cuda_ipc(*call_args, **call_kwargs)

    return {"vllm": vllm_route, "verl": verl_receive, "openrlhf": openrlhf_call}


# ----------------------------------------------------------------- trainer

class Link:
    """The trainer's end of the pipe: a request and its answer."""

    def __init__(self, conn, timeout):
        self.conn, self.timeout = conn, timeout

    def send(self, msg):
        self.conn.send(msg)

    def answer(self):
        if not self.conn.poll(self.timeout):
            raise TimeoutError("the engine did not answer")
        reply = self.conn.recv()
        if isinstance(reply, tuple) and reply[:1] == ("error",):
            raise RuntimeError(reply[1])
        if isinstance(reply, str) and reply.startswith("error"):
            raise RuntimeError(f"engine: {reply}")
        return reply

    def call(self, msg):
        self.send(msg)
        return self.answer()


def vllm_sender(args, link, model, packed):
    """vLLM's trainer side over its HTTP client, the pipe for HTTP."""
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    class PipeClient(HTTPVLLMWeightSyncClient):
        def _post(self, path, json=None):
            link.call(("vllm", path, json))

    engine = IPCTrainerWeightTransferEngine.trainer_init(
        IPCTrainerInitInfo(rank=0, packed=packed, packed_buffer_size_bytes=args.packed_mb << 20),
        client=PipeClient("http://engine"), source=ModuleSource(model))
    return engine.send_weights


def verl_sender(args, link, model):
    """verl's update_weights (vllm_rollout.py): the receiver started on the
    engine, then a fresh sender, its bucket, its cleanup."""
    import asyncio
    import uuid
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    timeline_verl()
    loop = asyncio.new_event_loop()
    handle = f"ipc:///tmp/rl-colocate-zmq-{uuid.uuid4().hex}.sock"

    def send():
        link.send(("verl", handle))
        sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=args.bucket_mb, use_shm=False)
        loop.run_until_complete(sender.async_send_weights((n, p.detach()) for n, p in model.named_parameters()))
        link.answer()
    return send


class _Ref:
    def __init__(self, link):
        self.link = link

    def result(self):
        return self.link.answer()


class _EngineActor:
    """An OpenRLHF vLLM engine actor as broadcast_to_vllm calls it:
    engine.update_weight_cuda_ipc.remote(...) then ray.get."""

    def __init__(self, link):
        class Method:
            @staticmethod
            def remote(*a, **kw):
                link.send(("openrlhf", a, kw))
                return _Ref(link)
        self.update_weight_cuda_ipc = Method


def openrlhf_sender(args, link, model):
    import types
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    actor = ActorPPOTrainer.__new__(ActorPPOTrainer)  # its __init__ builds a training loop
    actor.strategy = types.SimpleNamespace(args=types.SimpleNamespace(
        vllm=types.SimpleNamespace(), ds=types.SimpleNamespace(zero_stage=0, tensor_parallel_size=1)))
    actor.actor = types.SimpleNamespace(model=types.SimpleNamespace(module=model))
    actor.vllm_engines = [_EngineActor(link)]
    actor.use_cuda_ipc = True  # colocate_all, nccl backend, not async: OpenRLHF's own choice
    return actor.broadcast_to_vllm


def make_sender(args, case, link, model):
    if case == "vllm-tensor":
        return vllm_sender(args, link, model, False)
    if case == "vllm-packed":
        return vllm_sender(args, link, model, True)
    if case == "verl":
        return verl_sender(args, link, model)
    return openrlhf_sender(args, link, model)


def make_send(args, case, links, model):
    """One sync: the project's sender once per engine rank, to that rank
    only, in turn (the one trainer playing each rank's colocated trainer:
    one export per receiver, as PyTorch's refcount wants)."""
    senders = [make_sender(args, case, link, model) for link in links]
    if len(senders) == 1:
        return senders[0]

    def send():
        for sender in senders:
            sender()
    return send


def call_all(links, msg):
    """msg to every engine rank, then each one's answer (they work at once)."""
    for link in links:
        link.send(msg)
    return [link.answer() for link in links]


def change_weights(torch, named, k):
    """A new version of every weight: a bf16 step up and a marker."""
    with torch.no_grad():
        for _, p in named:
            p.add_(2.0 ** -7)
            p.view(-1)[0] = float(k % 97)


def trainer_main(args, alloc, conns, out_q):
    import torch
    results = []
    try:
        torch.cuda.set_device(0)
        links = [Link(conn, args.timeout) for conn in conns]
        ready = [link.answer() for link in links]
        start_timeline(args, torch)
        model = build_model(torch, args)
        named = list(model.named_parameters())
        init_dist(torch, "trainer")
        k = 0
        prev = {"engine": [None] * len(links), "trainer": None}  # the last stats lines, across cases
        for case in args.cases:
            result = {"alloc": alloc, "case": case, "error": None, "records": {}, "engine_pid": ready[0][1]}
            if len(links) > 1:
                result["engine_ranks"] = [{"pid": r[1], "gpu": r[2]} for r in ready]
            results.append(result)
            try:
                send = make_send(args, case, links, model)
                for state in args.states:
                    recs = result["records"][state] = []
                    for _ in range(args.warmup + args.syncs):
                        k += 1
                        recs.append(one_sync(args, torch, named, links, send, k, state, prev))
                    note(f"{args.label} {alloc} {case} {state}: step p50 "
                         f"{eb.median([r['step_ms'] for r in recs[args.warmup:]]):.1f} ms, values "
                         f"{'same' if all(r['values_ok'] for r in recs) else 'DIFFER'}")
            except Exception as exc:  # noqa: BLE001  (one case's failure is said; the next runs)
                result["error"] = f"{type(exc).__name__}: {exc}"
                note(f"{args.label} {alloc} {case}: FAILED: {result['error']}")
                if isinstance(exc, (TimeoutError, EOFError, BrokenPipeError)):
                    break
        for conn in conns:
            conn.send(None)
    except Exception as exc:  # noqa: BLE001
        results.append({"alloc": alloc, "case": "setup", "error": f"{type(exc).__name__}: {exc}", "records": {}})
    out_q.put(results)


def one_sync(args, torch, named, links, send, k, state, prev):
    """A new version of the weights, its sync timed, every rank's values
    checked; the record of the sync."""
    change_weights(torch, named, k)
    want = checksums(torch, named)
    if REC:
        REC.take()  # what came before this sync
    m_begin = time.monotonic_ns()
    call_all(links, ("begin", state == "busy"))
    if REC:
        REC.add("link begin", m_begin)
    t0 = time.perf_counter_ns()
    m0 = time.monotonic_ns()
    send()
    step = (time.perf_counter_ns() - t0) / 1e6
    m1 = time.monotonic_ns()
    ends = call_all(links, ("end",))
    free, _ = torch.cuda.mem_get_info()
    mine = stats_now()
    rec = {**rank_fields(want, ends, prev["engine"]),
           "trainer_delta": counter_delta(mine, prev["trainer"]),
           "step_ms": step, "trainer_free": free, "trainer_reserved": torch.cuda.memory_reserved(),
           "trainer_fds": open_fds(), "trainer_stats": mine}
    prev["trainer"] = mine or prev["trainer"]
    if REC:
        REC.add("sync", m0, m1)
        rec["timeline"] = {"t0": m0, "trainer": REC.take(), "engines": [e.get("timeline") or [] for e in ends]}
    return rec


# ----------------------------------------------------------------- run, report

def run_alloc(args, alloc):
    import multiprocessing as mp
    import queue as queue_mod
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(args.tp)]
    out_q = ctx.Queue()
    saved = eb.set_alloc_env(alloc)
    engines = [ctx.Process(target=engine_main, args=(args, ends[0], gpu))
               for ends, gpu in zip(pipes, rank_gpus(args.tp, args.gpus))]
    trainer = ctx.Process(target=trainer_main, args=(args, alloc, [ends[1] for ends in pipes], out_q))
    for p in engines:
        p.start()
    trainer.start()
    eb.restore_env(saved)
    try:
        results = out_q.get(timeout=args.timeout * max(1, len(args.cases)))
    except queue_mod.Empty:
        results = [{"alloc": alloc, "case": "all", "error": "no result in time", "records": {}}]
    codes = eb.finish([trainer, *engines], 60)
    results += [{"alloc": alloc, "case": case, "error": None, "skipped": why, "records": {}}
                for case, why in args.skipped.items()]
    for r in results:
        r["summary"] = {s: summarize(recs, args.warmup) for s, recs in r["records"].items() if recs}
        if r["error"] is None and any(r["summary"][s]["bad_syncs"] for s in r["summary"]):
            r["error"] = "a received weight differed from the trainer's"
        record_outcomes(args, r)
    if any(codes) and not any(r["error"] for r in results):
        results.append({"alloc": alloc, "case": "exit", "error": f"exit status: trainer {codes[0]}, "
                        f"engine {', '.join(map(str, codes[1:]))}", "records": {}, "summary": {}})
    return results


def record_outcomes(args, result):
    """Each case x state as a test of `make peer` (tools/peer_record.py, when
    PEER_RECORD is set): passed when every sync ran and every value was the
    trainer's, else failed."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    from peer_record import emit
    for state in args.states:
        tp = getattr(args, "tp", 1)
        test_id = f"rl::{result['alloc']}::{result['case']}::{state}" + (f"::tp{tp}" if tp > 1 else "")
        s = result["summary"].get(state)
        ok = result["error"] is None and s is not None and s["values_ok"]
        emit(test_id, "skipped" if result.get("skipped") else "passed" if ok else "failed")


def cmd_run(args):
    if eb.cuda_gpus() < 1:
        print("rl: skipped: no CUDA GPU (torch sees none)")
        return 77
    require_projects()
    args.gpus = eb.cuda_gpus()
    args.cases, args.skipped = split_cases(args.cases, rank_gpus(args.tp, args.gpus))
    for case, why in args.skipped.items():
        note(f"{case}: not run with --tp {args.tp}: {why}")
    results = []
    for alloc in args.allocs:
        results.extend(run_alloc(args, alloc))
    if args.out:
        opts = {k: v for k, v in vars(args).items() if k not in ("cmd", "out")}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"kind": "rl", "label": args.label, "preload": os.environ.get("LD_PRELOAD", ""),
                       "args": opts, "results": results}, f, indent=1)
    return 1 if any(r["error"] for r in results) else 0


def load_runs(paths):
    """The --out files, or None (said) when one is not rl_bench.py run's."""
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    if any(r.get("kind") != "rl" for r in runs):
        print("rl: not the files of rl_bench.py run", file=sys.stderr)
        return None
    return runs


def cmd_report(args):
    runs = load_runs(args.files)
    if runs is None:
        return 2
    print(report(runs))
    return 0


def cmd_timeline(args):
    runs = load_runs(args.files)
    if runs is None:
        return 2
    print(tlm.report(runs, args.min_ms))
    return 0


def main(argv):
    args = parse_args(argv)
    return {"run": cmd_run, "report": cmd_report, "timeline": cmd_timeline}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
