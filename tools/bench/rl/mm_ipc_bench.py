#!/usr/bin/env python3
"""vLLM's multimodal tensor queue (v1/engine/tensor_ipc.py): API server -> engine core.

What is vLLM's code and what is this bench's:
  vLLM 0.33 (vllm/v1/engine/tensor_ipc.py, imported, never changed):
    TensorIpcSender (per tensor: share_memory_, a TensorIpcData put on a
    torch.multiprocessing queue, the metadata returned for msgpack) and
    TensorIpcReceiver (drains the queue, buffers by sender and message,
    returns the tensor the metadata names). A CUDA tensor crosses by
    PyTorch's CUDA IPC (reduce_tensor / rebuild_cuda_tensor): the caching
    allocator's block, its segment opened by cudaIpcOpenMemHandle, or its
    pages imported by the VMM calls with expandable segments.
  This bench's: the two processes and the pipe between them (standing for
    msgpack over ZMQ: each request's metadata, sent after its features as
    vLLM's encoder sends one message per request); the API server's
    features: per request --features fresh bf16 tensors of --rows x --hidden
    on the GPU (default 1,176 x 3,584, 8 MiB: a 784 x 1,176 image's merged
    patches at Qwen2.5-VL-7B's hidden size), made through PyTorch's caching
    allocator, which reuses its segments request after request as a server's
    does; the engine core's use of each: an exact checksum on the GPU,
    compared with the API server's, then the tensor dropped (the IPC close);
    the library's counters (its stats signal), fds and device free memory.
    tools/rl_peer/site stands in for vllm.logger and vllm.v1.serial_utils.

One request is in flight at a time: the API server sends a request's
features, its metadata, then waits for the engine core's answer. A feature's
latency runs from the API server's send to the engine core's checksum read
back (CLOCK_MONOTONIC, one clock for both processes).

usage:
  mm_ipc_bench.py run [options]      both allocators in turn; exit 1 when a
                                     run failed or a feature differed
  mm_ipc_bench.py report A1 B A2     Markdown tables from the --out files of
                                     the runs without / with / without
The library is not chosen here: run the whole command without and with
LD_PRELOAD (tools/bench/bench.sh, BENCH_PARTS=vllm-mm, does A/B/A). vLLM's
file must be importable: bench.sh unpacks `make peer-fetch`'s copy and puts
it on PYTHONPATH with tools/rl_peer/site.
Exit status: 0 done, 1 a run failed, 2 a usage error or vLLM's file is
missing, 77 skipped (no CUDA GPU; --device cpu needs none).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_bench as eb  # noqa: E402  (percentiles, checksum, allocator settings, processes)
import rl_bench as rl  # noqa: E402  (the library's stats signal, fds, the report's cells)

KIND = "vllm-mm"
# Per feature, ms: the sender's call (share, put), the receiver's call (the
# queue's wait and unpickling, of which rebuild: rebuild_cuda_tensor, the IPC
# open), the checksum read back, the drop (the IPC close).
PHASES = ("send", "recv", "rebuild", "check", "release")
GIB = float(1 << 30)


def note(msg):
    print(f"vllm-mm: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- arithmetic (no torch)

def counters_per_request(first, last, requests):
    """The library's counters over the timed requests (stats lines at the
    first and after the last), per request; None without both lines."""
    delta = rl.counter_delta(last, first) if first else None
    if not delta or requests < 1:
        return None
    return {k: v / requests for k, v in delta.items()}


def _pcts(vals):
    vals = sorted(vals)
    return eb.percentile(vals, 50), eb.percentile(vals, 99)


def summarize(result, warmup):
    """One allocator's run: records are the requests in order, each with
    req_ms, values_ok and the per-feature lists of PHASES and lat_ms; mark
    and end the measures of both processes after the warm-up and at the
    end; elapsed_s the timed requests' wall time."""
    recs = result.get("records") or []
    timed = recs[warmup:]
    elapsed = result.get("elapsed_s")
    mark, end = result.get("mark") or {}, result.get("end") or {}
    lat = [x for r in timed for x in r["lat_ms"]]
    out = {"requests": len(recs), "timed": len(timed),
           "features": len(timed[0]["lat_ms"]) if timed else 0,
           "req_per_s": len(timed) / elapsed if timed and elapsed else None,
           "req_p50_ms": eb.median([r["req_ms"] for r in timed]),
           "values_ok": bool(recs) and all(r["values_ok"] for r in recs),
           "bad_requests": [i for i, r in enumerate(recs) if not r["values_ok"]]}
    out["lat_p50_ms"], out["lat_p99_ms"] = _pcts(lat)
    out["phase_p50_ms"] = {k: eb.median([x for r in timed for x in r.get(k + "_ms", [])]) for k in PHASES}
    for side in ("engine", "server"):
        first, last = (mark.get(side) or {}), (end.get(side) or {})
        free = last.get("free")
        out[f"{side}_free_gib"] = None if free is None else free / GIB
        out[f"{side}_per_request"] = counters_per_request(first.get("stats"), last.get("stats"), len(timed))
        out[f"{side}_fds"] = [first.get("fds"), last.get("fds")]
    stats = (end.get("engine") or {}).get("stats")
    if stats:
        out["engine_levels_last"] = {k: stats.get(k) for k in rl.LEVELS}
    return out


def _cells(runs):
    """allocator -> [summary per run], only allocators every run has."""
    cells = {}
    for run in runs:
        for r in run["results"]:
            if r.get("summary"):
                cells.setdefault(r["alloc"], []).append(r["summary"])
    return {k: v for k, v in cells.items() if len(v) == len(runs)}


def describe(args):
    """The runs' load, from run's options."""
    if not args:
        return []
    mib = args["rows"] * args["hidden"] * 2 / float(1 << 20)
    return [f"Per allocator: {args['requests']} timed requests after {args['warmup']}, one in flight, each "
            f"{args['features']} features of {args['rows']} x {args['hidden']} bf16 ({mib:.1f} MiB) made on "
            f"{args['device']} by the API server; req/s over its whole loop (the features made and checksummed, "
            "sent, answered); with / without: the run with the library against the mean of the runs without.",
            ""]


def report(runs):
    cells = _cells(runs)
    lines = [*describe(runs[0].get("args")), "| allocator | req/s without / **with** / without | with / without | feature latency p50 ms "
             "| p99 ms | values | device free after the run, GiB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    targets = []
    for alloc, ss in sorted(cells.items()):
        rps = [s["req_per_s"] for s in ss]
        gain = eb._ratio(rps[1], rl._without_mean(rps)) if len(ss) >= 2 else None
        lines.append(f"| {alloc} | {rl._trio(rps, '.1f')} | {rl._fmt(gain, '.2f')}x "
                     f"| {rl._trio([s['lat_p50_ms'] for s in ss], '.2f')} "
                     f"| {rl._trio([s['lat_p99_ms'] for s in ss], '.2f')} "
                     f"| {'same' if all(s['values_ok'] for s in ss) else 'DIFFER'} "
                     f"| {rl._trio([s['engine_free_gib'] for s in ss], '.2f')} |")
        targets += check_targets(alloc, ss)
    if len(runs) >= 2 and not [t for t in targets if "slower" in t]:
        targets.append("- no allocator slower with the library than a run without")
    errors = [f"- {run.get('label') or '?'} {r['alloc']}: FAILED: {r['error']}"
              for run in runs for r in run["results"] if r.get("error")]
    return "\n".join(lines + ["", *targets, *errors, "", *report_phases(cells), *report_library(cells)])


def check_targets(alloc, ss):
    """What the run with the library (ss[1]) missed against the runs without."""
    if len(ss) < 2:
        return []
    out = []
    rps, rest = ss[1]["req_per_s"], [s["req_per_s"] for i, s in enumerate(ss) if i != 1 and s["req_per_s"]]
    if rps is not None and rest and rps < max(rest):
        out.append(f"- {alloc}: slower with the library than a run without ({rps:.1f} req/s against "
                   f"{max(rest):.1f})")
    free = [s["engine_free_gib"] for s in ss]
    base = rl._without_mean(free)
    if base and free[1] is not None and abs(free[1] - base) / base > 0.01:
        out.append(f"- {alloc}: device free memory after the run {(free[1] - base) / base * 100:+.1f}% "
                   "with the library (target: within 1%)")
    if not all(s["values_ok"] for s in ss):
        out.append(f"- {alloc}: a received feature differed from the API server's")
    return out


def report_phases(cells):
    rows = [f"| {alloc} | {k} | {rl._trio([s['phase_p50_ms'].get(k) for s in ss], '.3f')} |"
            for alloc, ss in sorted(cells.items()) for k in PHASES]
    if not rows:
        return []
    return ["Where a feature goes (host ms, median of the timed features): send is vLLM's TensorIpcSender "
            "call in the API server, recv its TensorIpcReceiver call in the engine core (the queue's wait "
            "and unpickling), of which rebuild is PyTorch's rebuild_cuda_tensor (the IPC open); check the "
            "checksum read back, release the drop of the tensor (the IPC close).", "",
            "| allocator | phase | without / **with** / without |", "| --- | --- | --- |", *rows, ""]


def report_library(cells):
    rows = []
    for alloc, ss in sorted(cells.items()):
        if len(ss) < 2 or not ss[1].get("engine_per_request"):
            continue
        d, srv = ss[1]["engine_per_request"], ss[1].get("server_per_request") or {}
        lv = ss[1].get("engine_levels_last") or {}
        fds = ss[1].get("engine_fds") or [None, None]
        rows.append(f"| {alloc} | {rl._counts(d)} | {d['releases_on_request']:g} / "
                    f"{srv.get('releases_on_request', 0):g} | {rl._fmt((lv.get('idle_bytes') or 0) / GIB, '.2f')} "
                    f"| {rl._fmt((lv.get('ghost_bytes') or 0) / GIB, '.2f')} | {fds[0]} → {fds[1]} |")
    if not rows:
        return []
    return ["The library in the engine core, per request (its counters over the timed requests, divided by "
            "them; the run with it); idle and ghost bytes at the end; the engine core's open fds after the "
            "warm-up and at the end:", "",
            "| allocator | opens / hits | VMM imports / hits | VMM maps / hits | evictions "
            "| releases on request (engine core / API server) | idle GiB | ghost GiB | fds |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""]


# ----------------------------------------------------------------- arguments

def parse_args(argv):
    p = argparse.ArgumentParser(prog="mm_ipc_bench.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--allocs", type=eb._choices("--allocs", eb.ALLOCS), default=list(eb.ALLOCS))
    r.add_argument("--requests", type=eb._positive("--requests"), default=200, help="timed requests per allocator")
    r.add_argument("--warmup", type=int, default=20, help="untimed requests first (values still checked)")
    r.add_argument("--features", type=eb._positive("--features"), default=4, help="feature tensors per request")
    r.add_argument("--rows", type=eb._positive("--rows"), default=1176, help="a feature's rows (image tokens)")
    r.add_argument("--hidden", type=eb._positive("--hidden"), default=3584, help="a feature's columns (hidden size)")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: CPU tensors (vLLM's queue shares them by shared memory), for a test without a GPU")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds per allocator")
    r.add_argument("--out", help="write the results as JSON here")
    r.add_argument("--label", default="", help="a name for this run in the report (A1, B, A2)")
    rep = sub.add_parser("report")
    rep.add_argument("files", nargs="+", help="without, with[, without again]")
    args = p.parse_args(argv)
    if args.cmd == "run" and args.warmup < 0:
        p.error("--warmup must not be negative")
    if args.cmd == "report" and not 2 <= len(args.files) <= 3:
        p.error("report takes two or three files")
    return args


def require_tensor_ipc():
    """vLLM's file importable, else exit 2 naming make peer-fetch."""
    import importlib.util
    if not rl._findable(importlib.util, "vllm.v1.engine.tensor_ipc"):
        print("vllm-mm: vLLM's vllm/v1/engine/tensor_ipc.py is missing: run `make peer-fetch` on a machine "
              "with the network, then `BENCH_PARTS=vllm-mm make bench` (it unpacks it)", file=sys.stderr)
        sys.exit(2)


# ----------------------------------------------------------------- the two processes

def setup_device(torch, args):
    import torch.multiprocessing  # noqa: F401  (its reductions: tensors pickle by IPC)
    if args.device == "cpu":
        return torch.device("cpu")
    torch.cuda.set_device(0)
    torch.cuda.init()
    return torch.device("cuda:0")


def measures(torch, device):
    """This process's stats line, fds, and the device's free memory."""
    out = {"stats": rl.stats_now(), "fds": rl.open_fds(), "free": None, "reserved": None}
    if device.type == "cuda":
        torch.cuda.synchronize()
        out["free"] = torch.cuda.mem_get_info()[0]
        out["reserved"] = torch.cuda.memory_reserved()
    return out


def consume(torch, receiver, clock, metas, want, sent):
    """The engine core's side of one request: each feature from vLLM's
    receiver, its checksum read back, the tensor dropped."""
    got, rec = [], {k + "_ms": [] for k in PHASES}
    rec["lat_ms"] = []
    for (dtype, shape, meta), t_sent in zip(metas, sent):
        clock["rebuild"] = 0
        r0 = time.monotonic_ns()
        t = receiver(dtype, shape, meta)
        r1 = time.monotonic_ns()
        got.append(eb.checksum(torch, t).item())
        r2 = time.monotonic_ns()
        del t
        r3 = time.monotonic_ns()
        for k, a, b in (("lat", t_sent, r2), ("recv", r0, r1), ("check", r1, r2), ("release", r2, r3)):
            rec[k + "_ms"].append((b - a) / 1e6)
        rec["rebuild_ms"].append(clock["rebuild"] / 1e6)
    rec["bad"] = [j for j, (a, b) in enumerate(zip(got, want)) if a != b]
    rec["values_ok"] = not rec["bad"] and len(got) == len(want)
    return rec


def consumer_main(args, conn, queue):
    """The engine core: vLLM's TensorIpcReceiver on the queue, the metadata
    from the pipe."""
    import torch
    try:
        device = setup_device(torch, args)
        clock = {"rebuild": 0}
        if device.type == "cuda":
            rl.timed_rebuild(clock)
        from vllm.v1.engine.tensor_ipc import TensorIpcReceiver
        receiver = TensorIpcReceiver(queue)
        conn.send(("ready", os.getpid()))
        while True:
            msg = conn.recv()
            if msg is None:
                break
            if msg[0] == "request":
                conn.send(consume(torch, receiver, clock, *msg[1:]))
            else:  # "mark", "end"
                conn.send(measures(torch, device))
    except (EOFError, KeyboardInterrupt):
        pass
    except Exception as exc:  # noqa: BLE001  (said to the API server, which stops)
        try:
            conn.send(("error", f"engine core: {type(exc).__name__}: {exc}"))
        except OSError:
            pass
        raise


def one_request(args, torch, sender, link, gen, device):
    """The API server's side of one request: fresh features, their
    checksums, each through vLLM's sender, the metadata, the answer."""
    feats = [torch.randn(args.rows, args.hidden, dtype=torch.bfloat16, device=device, generator=gen)
             for _ in range(args.features)]
    want = torch.stack([eb.checksum(torch, f) for f in feats]).tolist()
    sender.new_message()
    metas, sent, send_ms = [], [], []
    t0 = time.perf_counter_ns()
    for f in feats:
        s0 = time.monotonic_ns()
        meta = sender(f)
        s1 = time.monotonic_ns()
        if meta is None:
            raise RuntimeError("vLLM's TensorIpcSender did not send a feature (it returned None: see its warning)")
        metas.append((str(f.dtype).replace("torch.", ""), tuple(f.shape), meta))
        sent.append(s0)
        send_ms.append((s1 - s0) / 1e6)
    link.send(("request", metas, want, sent))
    del feats, f
    rec = link.answer()
    rec["req_ms"] = (time.perf_counter_ns() - t0) / 1e6
    rec["send_ms"] = send_ms
    return rec


def producer_main(args, conn, queue, out_q):
    """The API server: the requests, measured; its result to out_q."""
    import torch
    result = {"records": [], "error": None, "mark": {}, "end": {}}
    link = rl.Link(conn, args.timeout)
    try:
        device = setup_device(torch, args)
        from vllm.v1.engine.tensor_ipc import TensorIpcSender
        sender = TensorIpcSender(queue)
        gen = torch.Generator(device=device)
        gen.manual_seed(0)
        result["engine_pid"] = link.answer()[1]
        t_start = time.perf_counter()
        for i in range(args.warmup + args.requests):
            if i == args.warmup:
                result["mark"] = {"engine": link.call(("mark",)), "server": measures(torch, device)}
                t_start = time.perf_counter()
            rec = one_request(args, torch, sender, link, gen, device)
            if not rec["values_ok"]:
                note(f"{args.label} request {i}: features {rec['bad']} differ from the API server's")
            result["records"].append(rec)
        result["elapsed_s"] = time.perf_counter() - t_start
        result["end"] = {"engine": link.call(("end",)), "server": measures(torch, device)}
    except Exception as exc:  # noqa: BLE001  (said in the result)
        result["error"] = f"{type(exc).__name__}: {exc}"
    try:
        conn.send(None)
    except OSError:
        pass
    out_q.put(result)


def run_alloc(args, alloc):
    import queue as queue_mod
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("spawn")
    engine_end, server_end = ctx.Pipe()
    tensor_q = ctx.Queue()  # vLLM's TensorIpcQueue: a multiprocessing queue
    out_q = ctx.Queue()
    saved = eb.set_alloc_env(alloc)
    engine = ctx.Process(target=consumer_main, args=(args, engine_end, tensor_q))
    server = ctx.Process(target=producer_main, args=(args, server_end, tensor_q, out_q))
    engine.start()
    server.start()
    eb.restore_env(saved)
    engine_end.close()  # the children's alone: one's exit is the other's EOF
    server_end.close()
    try:
        result = out_q.get(timeout=args.timeout + 30)
    except queue_mod.Empty:
        result = {"records": [], "error": "no result in time"}
    codes = eb.finish([server, engine], 60)
    result["alloc"] = alloc
    result["summary"] = summarize(result, args.warmup)
    if result["error"] is None and result["summary"]["bad_requests"]:
        result["error"] = "a received feature differed from the API server's"
    if result["error"] is None and any(codes):
        result["error"] = f"exit status: API server {codes[0]}, engine core {codes[1]}"
    return result


def cmd_run(args):
    if args.device == "cuda" and eb.cuda_gpus() < 1:
        print("vllm-mm: skipped: no CUDA GPU (torch sees none)")
        return 77
    require_tensor_ipc()
    results = []
    for alloc in args.allocs:
        r = run_alloc(args, alloc)
        s = r["summary"]
        if r["error"]:
            note(f"{args.label} {alloc}: FAILED: {r['error']}")
        else:
            note(f"{args.label} {alloc}: {rl._fmt(s['req_per_s'], '.1f')} req/s, feature p50 "
                 f"{rl._fmt(s['lat_p50_ms'], '.2f')} ms, values {'same' if s['values_ok'] else 'DIFFER'}")
        results.append(r)
    eb.write_out(args, KIND, results)
    return 1 if any(r["error"] for r in results) else 0


def cmd_report(args):
    runs = []
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    if any(r.get("kind") != KIND for r in runs):
        print("vllm-mm: not the files of mm_ipc_bench.py run", file=sys.stderr)
        return 2
    print(report(runs))
    return 0


def main(argv):
    args = parse_args(argv)
    return {"run": cmd_run, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
