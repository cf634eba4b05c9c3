"""The timeline of rl_bench.py --timeline: where a sync goes in the trainer and
each engine rank, on one clock.

Recording: spans [name, t0, t1] in time.monotonic_ns() (CLOCK_MONOTONIC, the
same clock in every process of one host), one list append per call, around
the bench's own steps and around the library calls the projects' code makes,
wrapped from here (their files are never changed): zmq's socket send / recv /
send_pyobj / recv_pyobj, torch.cuda's synchronize, ipc_collect and
empty_cache (and torch.accelerator.synchronize, vLLM's), torch.distributed's
barrier and all_gather_object (OpenRLHF's), PyTorch's reduce_tensor, verl's
rebuild_ipc and its sender's and receiver's socket, buffer and cleanup steps.
Nothing is wrapped without --timeline.

Stored per sync, collapsed: a run of one name in a row (434 reduce_tensor) is
one span [name, first t0, last t1, count, summed ns].

Reporting (no torch): per case, allocator and engine state, the median over
the timed syncs of each event's offset from the sync's start and of its
length, events matched across syncs by process, name and occurrence; then,
for each long event, what the other processes were in meanwhile.
"""
import threading
import time


class Recorder:
    """The spans of one process. wrap() replaces owner.attr by a function that
    records around the real one; a group's nested calls (send_pyobj calls
    send) record only the outermost."""

    def __init__(self):
        self.spans = []
        self._depth = threading.local()

    def add(self, name, t0, t1=None):
        self.spans.append([name, t0, time.monotonic_ns() if t1 is None else t1])

    def take(self):
        """The spans since the last take, collapsed; the list starts again."""
        spans, self.spans = self.spans, []
        return collapse(spans)

    def wrap(self, owner, attr, name=None, group=None, keep=None):
        real = getattr(owner, attr, None)
        if real is None or getattr(real, "_rl_timeline", False):
            return False
        label = name or attr
        rec = self

        def timed(*args, **kwargs):
            if keep is not None and not keep(args, kwargs):
                return real(*args, **kwargs)
            depth = getattr(rec._depth, group, 0) if group else 0
            if depth:
                return real(*args, **kwargs)
            if group:
                setattr(rec._depth, group, 1)
            t0 = time.monotonic_ns()
            try:
                return real(*args, **kwargs)
            finally:
                rec.spans.append([label, t0, time.monotonic_ns()])
                if group:
                    setattr(rec._depth, group, 0)
        timed._rl_timeline = True
        timed.__name__ = getattr(real, "__name__", attr)
        timed.__doc__ = getattr(real, "__doc__", None)
        setattr(owner, attr, timed)
        return True


def collapse(spans):
    """Spans by start; a run of one name in a row becomes one entry
    [name, t0, t1, count, ns]."""
    out = []
    for name, t0, t1 in sorted(spans, key=lambda s: (s[1], -s[2])):
        last = out[-1] if out else None
        if last and last[0] == name and t0 >= last[2]:
            last[2], last[3], last[4] = t1, last[3] + 1, last[4] + (t1 - t0)
        else:
            out.append([name, t0, t1, 1, t1 - t0])
    return out


def install_torch(rec, torch):
    """The library calls the projects make through torch, wrapped; before the
    projects import (they bind reduce_tensor by name)."""
    for attr in ("synchronize", "ipc_collect", "empty_cache"):
        rec.wrap(torch.cuda, attr, f"cuda.{attr}")
    accel = getattr(torch, "accelerator", None)
    if accel is not None:
        rec.wrap(accel, "synchronize", "accelerator.synchronize")
    dist = getattr(torch, "distributed", None)
    if dist is not None:
        for attr in ("barrier", "all_gather_object"):
            rec.wrap(dist, attr, f"dist.{attr}")
    # Not torch.empty: torch's device context (the engine's `with
    # torch.device`) knows its factory functions by identity, and a wrapped
    # one made CUDA-graph forwards build CPU tensors (H200, 12-04). A bucket's
    # allocation shows in verl's init_buffer span.
    import torch.multiprocessing.reductions as red
    rec.wrap(red, "reduce_tensor")


def install_zmq(rec):
    """zmq's sockets (verl's pair): the sugar Socket class is Python, so its
    methods can be replaced for every socket."""
    try:
        import zmq
    except ImportError:
        return
    for attr in ("send", "recv", "send_pyobj", "recv_pyobj"):
        rec.wrap(zmq.Socket, attr, f"zmq.{attr}", group="zmq")


def install_verl(rec, mod):
    """verl's steps: its rebuild_ipc (looked up by name at each call) and its
    sender's and receiver's socket, buffer and cleanup."""
    rec.wrap(mod, "rebuild_ipc", "verl.rebuild_ipc")
    for cls, side in ((mod.BucketedWeightSender, "sender"), (mod.BucketedWeightReceiver, "receiver")):
        for attr in ("_init_socket", "_init_buffer", "_cleanup"):
            rec.wrap(cls, attr, f"verl.{side}.{attr.lstrip('_')}")


# ----------------------------------------------------------------- report (no torch)

def _median(vals):
    s = sorted(vals)
    n = len(s)
    if not n:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def sync_events(tl):
    """One sync's stored timeline -> events (process, name, nth, start ms,
    length ms, count), offsets from the sync's start."""
    t0 = tl["t0"]
    procs = [("trainer", tl["trainer"])] + [
        (f"engine{r}" if len(tl["engines"]) > 1 else "engine", spans) for r, spans in enumerate(tl["engines"])]
    out = []
    for proc, spans in procs:
        seen = {}
        for name, a, b, count, _ns in spans:
            nth = seen[name] = seen.get(name, -1) + 1
            out.append((proc, name, nth, (a - t0) / 1e6, (b - a) / 1e6, count))
    return out


def median_timeline(timelines):
    """The events seen in at least half the syncs, each with its median start
    and length (ms) and count, by start."""
    per = {}
    for tl in timelines:
        for proc, name, nth, start, length, count in sync_events(tl):
            per.setdefault((proc, name, nth), []).append((start, length, count))
    need = (len(timelines) + 1) // 2
    rows = []
    for (proc, name, nth), got in per.items():
        if len(got) >= need:
            rows.append({"proc": proc, "name": name, "nth": nth,
                         "start": _median([g[0] for g in got]), "ms": _median([g[1] for g in got]),
                         "count": _median([g[2] for g in got]), "seen": len(got)})
    rows.sort(key=lambda r: (r["start"], -r["ms"]))
    return rows


def _overlap(a, b):
    return max(0.0, min(a["start"] + a["ms"], b["start"] + b["ms"]) - max(a["start"], b["start"]))


def meanwhile(rows, ev, other):
    """What process `other` was in during event ev: its recorded event that
    overlaps ev most (the shorter one on a tie, the more precise), or None
    when nothing recorded covers at least half of ev."""
    best = None
    for r in rows:
        if r["proc"] != other or r is ev:
            continue
        ov = _overlap(ev, r)
        if ov > 0 and (best is None or (ov, -r["ms"]) > (best[0], -best[1]["ms"])):
            best = (ov, r)
    if best is None or best[0] < ev["ms"] / 2:
        return None
    return best[1]


def _label(r):
    return r["name"] + (f" x{r['count']:g}" if r["count"] and r["count"] > 1 else "")


# At most this many events a cell (OpenRLHF's 434 calls a sync): the longest.
MAX_ROWS = 80


def report_cell(title, timelines, min_ms):
    rows = median_timeline(timelines)
    if not rows:
        return []
    left = []
    if len(rows) > MAX_ROWS:
        kept = sorted(rows, key=lambda r: -r["ms"])[:MAX_ROWS]
        left = [f"({len(rows) - MAX_ROWS} events shorter than {kept[-1]['ms']:.2f} ms left out)", ""]
        rows = sorted(kept, key=lambda r: (r["start"], -r["ms"]))
    procs = sorted({r["proc"] for r in rows}, key=lambda p: (p != "trainer", p))
    lines = [f"### {title}: the median sync of {len(timelines)}, ms from its start", "", *left,
             "| start | ms | " + " | ".join(procs) + " |", "| --- | --- | " + " | ".join("---" for _ in procs) + " |"]
    for r in rows:
        cells = [_label(r) if p == r["proc"] else "" for p in procs]
        lines.append(f"| {r['start']:.1f} | {r['ms']:.1f} | " + " | ".join(cells) + " |")
    notes = []
    for r in rows:
        if r["ms"] < min_ms:
            continue
        for p in procs:
            if p == r["proc"]:
                continue
            m = meanwhile(rows, r, p)
            what = f"in {_label(m)} ({m['ms']:.1f} ms from {m['start']:.1f})" if m else "in no recorded call"
            notes.append(f"- {r['proc']} {_label(r)} {r['ms']:.1f} ms (from {r['start']:.1f}) while {p} {what}")
    return lines + ["", *notes, ""]


def report(runs, min_ms):
    """Each run's cells with a timeline, one section each."""
    out = []
    for run in runs:
        warmup = run.get("args", {}).get("warmup", 0)
        for res in run["results"]:
            for state, recs in sorted((res.get("records") or {}).items()):
                tls = [r["timeline"] for r in recs[warmup:] if r.get("timeline")]
                if tls:
                    tp = run.get("args", {}).get("tp", 1)
                    title = (f"{run.get('label') or 'run'} {res['case']}, {res['alloc']}, {state}"
                             + (f", tp {tp}" if tp > 1 else ""))
                    out += report_cell(title, tls, min_ms)
    return "\n".join(out) if out else "rl: no timeline in these files (run with --timeline)"
