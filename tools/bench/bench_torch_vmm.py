#!/usr/bin/env python3
"""PyTorch's two sharing paths, legacy IPC and expandable segments (VMM), A/B/A.

One allocator setting per run (--alloc legacy|expandable: the script sets
PYTORCH_CUDA_ALLOC_CONF before torch starts; the spawned consumers inherit
it). The main process (producer, trainer) stays without the shim; each phase
spawns fresh consumers, A1 without the shim, B with it (LD_PRELOAD=--shim),
A2 without, one per --consumer-devices entry, so the three phases run inside
one run on the same producer memory.

  feature  the producer owns a --pool-mb uint8 pool (its own segment) and sends
           1 MiB slices of it (rotating) pickled as torch.multiprocessing does
           (reduce_tensor); the consumer times rebuild (unpickle) + use (copy
           into its own buffer, synchronize) + release (drop: the close or
           unmap), checks the value and acks. Per feature: median of the three
           together. Two passes: "busy", the producer fills each slice with a
           new value on GPU 0 just before sending it (a consumer on GPU 0 then
           waits for the GPU to switch from the producer's context to its own),
           and "idle", the pool is filled once before the pass and the producer
           sends without touching the GPU (the consumer's own cost alone).
  rl       the trainer holds a model's parameters (--layers decoder layers of
           6 tensors + embedding + final norm, bf16, allocated on a side stream
           so that they have their own segment) and each step marks them, then
           shares all of them in one message; the engine rebuilds them, copies
           each into its own weights, synchronizes, checks the mark, drops
           them and acks. Per step: median trainer time from share to ack;
           steps/s over the timed steps; the trainer's share (pickling)
           and the engine's rebuild / copy / drop medians beside.

  --shapes the weight sync's shapes (issue 17) instead, one fresh engine per
           phase and shape, so each engine's stats are its shape's alone:
           one (each tensor pickled alone; the engine rebuilds, copies and
           drops it before the next, same order every step), reversed (the
           same, order reversed every other step), shuffled (a new order
           every step), all (the rl message above), buckets (the parameters
           flattened into --bucket-mb buckets, each rebuilt, unpacked and
           dropped in turn), two (two engines, served one tensor at a time in
           turn), one_synced (one, the engine waiting for each copy before
           it drops the tensor, as PyTorch's own release of an imported
           expandable segment does: legacy then waits as often, which leaves
           the mapping's own cost as the difference). Per step: the trainer's
           median and steps/s, the trainer's share (pickling) per step; per
           tensor, the engine's rebuild, copy, wait and drop medians; with the
           cache, the engine's VMM imports, maps and map hits. --quick: 4 layers, 8
           timed steps, no features (a few minutes for both allocators).

Output: one JSON file (--out) with every phase's figures and, when
IPCCACHE_STATS_FILE is given (with %p), the consumer's stats line; a short
summary on stdout.
"""
import argparse
import json
import os
import pickle
import statistics
import sys
import time

FEATURE_BYTES = 1 << 20
PHASES = [("A1", False), ("B", True), ("A2", False)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alloc", choices=["legacy", "expandable"], required=True)
    p.add_argument("--shim", required=True, help="the library preloaded into the B consumers")
    p.add_argument("--consumer-devices", default="0", help="comma list, e.g. 0,1")
    p.add_argument("--pool-mb", type=int, default=512)
    p.add_argument("--features", type=int, default=500, help="timed features per consumer")
    p.add_argument("--layers", type=int, default=22, help="rl: decoder layers (6 tensors each)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=64000)
    p.add_argument("--steps", type=int, default=30, help="rl: timed steps per consumer (0: skip)")
    p.add_argument("--warmup", type=int, default=3, help="untimed features/steps first")
    p.add_argument("--stats-dir", help="write each consumer's ipccache stats line here")
    p.add_argument("--shapes", help="comma list of one,reversed,shuffled,all,buckets,two,one_synced: the "
                   "weight sync's shapes instead of features and rl")
    p.add_argument("--bucket-mb", type=int, default=512, help="shapes: a flattened bucket's size")
    p.add_argument("--quick", action="store_true", help="shapes: 4 layers, 8 steps")
    p.add_argument("--out", help="JSON result")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one reply")
    return p.parse_args(argv)


def model_shapes(a):
    """A small decoder's parameters: 6 per layer, embedding, final norm."""
    h, i = a.hidden, a.inter
    layer = [(3 * h, h), (h, h), (2 * i, h), (h, i), (h,), (h,)]
    return [(a.vocab, h)] + layer * a.layers + [(h,)]


def median_us(seconds):
    return round(statistics.median(seconds) * 1e6, 1)


def p99_us(seconds):
    s = sorted(seconds)
    return round(s[min(len(s) - 1, int(0.99 * len(s)))] * 1e6, 1)


# ------------------------------------------------------------------ consumer

def consumer_main(conn, device):
    """Spawned: serve 'feature' and 'rl' messages until None."""
    import torch

    torch.cuda.set_device(device)
    out = torch.empty(FEATURE_BYTES, dtype=torch.uint8, device=device)
    weights = None
    times, bad = {"step": []}, 0
    for prefix in ("", "idle_", "rl_"):
        for part in ("rebuild", "use", "release", "feature"):
            times[prefix + part] = []
    for part in PIECE_PARTS:
        times["piece_" + part] = []
    torch.cuda.synchronize()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        kind, value, payload, timed = msg
        if kind == "rl_shapes":
            weights = [torch.empty(s, dtype=torch.bfloat16, device=device) for s in payload]
            conn.send("ok")
            continue
        if kind in ("one", "one_synced", "buckets"):
            bad += rebuild_pieces(torch, weights, kind, value, payload, times if timed else None)
            conn.send("ack")
            continue
        t0 = time.perf_counter()
        shared = pickle.loads(payload)
        t1 = time.perf_counter()
        feature = kind in ("feature", "feature_idle")
        if feature:
            out.copy_(shared)
        else:
            for w, s in zip(weights, shared):
                w.copy_(s)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        del shared
        t3 = time.perf_counter()
        first = out[0] if feature else weights[0][0, 0]
        bad += int(first.item()) != value
        if timed and feature:
            prefix = "idle_" if kind == "feature_idle" else ""
            times[prefix + "rebuild"].append(t1 - t0)
            times[prefix + "use"].append(t2 - t1)
            times[prefix + "release"].append(t3 - t2)
            times[prefix + "feature"].append(t3 - t0)
        elif timed:
            times["step"].append(t3 - t0)
            times["rl_rebuild"].append(t1 - t0)
            times["rl_use"].append(t2 - t1)
            times["rl_release"].append(t3 - t2)
        conn.send("ack")
    conn.send({"pid": os.getpid(), "bad": bad, "times": times})


PIECE_PARTS = ("rebuild", "copy", "wait", "release")


def rebuild_pieces(torch, weights, kind, mark, payload, times=None):
    """Shapes: each piece rebuilt, copied into the engine's weights and
    dropped before the next (one_synced: after waiting for the copy); 1 when
    the mark (in weights[0]) is wrong. times: each part's seconds appended."""
    check = False
    for idx, blob in payload:
        t0 = time.perf_counter()
        piece = pickle.loads(blob)
        t1 = time.perf_counter()
        if kind in ("one", "one_synced"):
            weights[idx].copy_(piece)
            check |= idx == 0
        else:  # a bucket: idx lists (weight, offset, numel)
            for w, off, numel in idx:
                weights[w].view(-1).copy_(piece[off:off + numel])
                check |= w == 0
        t2 = time.perf_counter()
        if kind == "one_synced":
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        del piece
        t4 = time.perf_counter()
        if times is not None:
            for part, dt in zip(PIECE_PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times["piece_" + part].append(dt)
    torch.cuda.synchronize()
    return int(check and int(weights[0][0, 0].item()) != mark)


# ------------------------------------------------------------------ producer

def request(conn, msg, timeout):
    conn.send(msg)
    if not conn.poll(timeout):
        raise TimeoutError("consumer did not answer within %.0f s" % timeout)
    return conn.recv()


def slice_value(k):
    return k % 251 + 1


def run_features(torch, pool, conn, a, busy):
    """Slices of the pool, one at a time, each acked before the next; busy:
    each filled with a new value just before it is sent, else the whole pool
    filled once first."""
    from multiprocessing.reduction import ForkingPickler

    nslices = pool.numel() // FEATURE_BYTES
    if not busy:
        values = (torch.arange(nslices, device=pool.device) % 251 + 1).to(torch.uint8)
        pool.view(nslices, FEATURE_BYTES).copy_(values[:, None].expand(nslices, FEATURE_BYTES))
        torch.cuda.synchronize()
    for i in range(a.warmup + a.features):
        k = i * 7 % nslices
        value = slice_value(i) if busy else slice_value(k)
        piece = pool[k * FEATURE_BYTES:(k + 1) * FEATURE_BYTES]
        if busy:
            piece.fill_(value)
            torch.cuda.synchronize()
        request(conn, ("feature" if busy else "feature_idle", value,
                       bytes(ForkingPickler.dumps(piece)), i >= a.warmup), a.timeout)


def run_rl(torch, params, conn, a):
    """One message of every parameter per step; returns trainer seconds per
    timed step, the share (pickling) part of each, and the timed wall time."""
    from multiprocessing.reduction import ForkingPickler

    request(conn, ("rl_shapes", 0, [tuple(p.shape) for p in params], False), a.timeout)
    steps, shares, begun = [], [], None
    for i in range(a.warmup + a.steps):
        mark = i % 200 + 1  # exact in bf16
        params[0][0, 0] = mark
        torch.cuda.synchronize()
        if i == a.warmup:
            begun = time.perf_counter()
        t0 = time.perf_counter()
        payload = bytes(ForkingPickler.dumps(params))
        shared = time.perf_counter()
        request(conn, ("rl", mark, payload, i >= a.warmup), a.timeout)
        if i >= a.warmup:
            steps.append(time.perf_counter() - t0)
            shares.append(shared - t0)
    return steps, shares, time.perf_counter() - begun


def step_order(shape, step, n):
    order = list(range(n))
    if shape == "reversed" and step % 2:
        order.reverse()
    if shape == "shuffled":
        import random
        random.Random(step).shuffle(order)
    return order


def make_buckets(torch, params, a):
    """Flat bf16 buckets of --bucket-mb (allocated once) and which parameter
    lies where: [(bucket, [(param, offset, numel), ...])]."""
    cap = (a.bucket_mb << 20) // 2
    layout, cur, used = [], [], 0
    for i, p in enumerate(params):
        if cur and used + p.numel() > cap:
            layout.append((used, cur))
            cur, used = [], 0
        cur.append((i, used, p.numel()))
        used += p.numel()
    layout.append((used, cur))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        bufs = [torch.empty(n, dtype=torch.bfloat16, device=0) for n, _ in layout]
    torch.cuda.synchronize()
    return [(b, parts) for b, (_, parts) in zip(bufs, layout)]


def run_shape(torch, params, conns, a, shape, buckets):
    """Steps of one shape; trainer seconds per timed step and the timed wall time."""
    from multiprocessing.reduction import ForkingPickler

    dump = lambda t: bytes(ForkingPickler.dumps(t))
    for c in conns:
        request(c, ("rl_shapes", 0, [tuple(p.shape) for p in params], False), a.timeout)
    steps, shares, begun = [], [], None
    for i in range(a.warmup + a.steps):
        mark = i % 200 + 1
        params[0][0, 0] = mark
        if shape == "buckets":
            for b, parts in buckets:
                for w, off, numel in parts:
                    b[off:off + numel].copy_(params[w].view(-1))
        torch.cuda.synchronize()
        if i == a.warmup:
            begun = time.perf_counter()
        t0 = time.perf_counter()
        timed = i >= a.warmup
        shared = 0.0
        if shape == "all":
            blob = dump(params)
            shared += time.perf_counter() - t0
            request(conns[0], ("rl", mark, blob, timed), a.timeout)
        elif shape == "buckets":
            for b, parts in buckets:
                s0 = time.perf_counter()
                blob = dump(b)
                shared += time.perf_counter() - s0
                request(conns[0], ("buckets", mark, [(parts, blob)], timed), a.timeout)
        else:
            kind = "one_synced" if shape == "one_synced" else "one"
            for idx in step_order(shape, i, len(params)):
                s0 = time.perf_counter()
                msg = (kind, mark, [(idx, dump(params[idx]))], timed)
                shared += time.perf_counter() - s0
                for c in conns:  # two: the engines in turn, one tensor each
                    request(c, msg, a.timeout)
        if timed:
            steps.append(time.perf_counter() - t0)
            shares.append(shared)
    return steps, shares, time.perf_counter() - begun


def main_shapes(torch, mp, a, params):
    """Every shape, legacy or expandable as the run's --alloc, A/B/A."""
    shapes = a.shapes.split(",")
    buckets = make_buckets(torch, params, a) if "buckets" in shapes else None
    ctx = mp.get_context("spawn")
    runs = [(label, shim, shape) for shape in shapes for label, shim in PHASES]
    rows = []
    for label, shim, shape in runs:  # fresh engines: stats of this shape alone
        tag = "%s_%s_%s" % (a.alloc, label, shape)
        engines = [spawn(ctx, 0, shim, a, "%s_e%d" % (tag, e)) for e in range(2 if shape == "two" else 1)]
        for _, conn in engines:
            if not conn.poll(a.timeout) or conn.recv() != "ready":
                raise TimeoutError("an engine did not start")
        steps, shares, wall = run_shape(torch, params, [c for _, c in engines], a, shape, buckets)
        row = {"shape": shape, "phase": label, "cache": "on" if shim else "off",
               "step_ms_p50": round(statistics.median(steps) * 1e3, 2),
               "steps_per_s": round(len(steps) / wall, 2), "steps": len(steps),
               "share_ms_p50": round(statistics.median(shares) * 1e3, 2)}
        bad, stats = 0, []
        for e, (proc, conn) in enumerate(engines):
            report = request(conn, None, a.timeout)
            proc.join(a.timeout)
            bad += report["bad"] + (proc.exitcode != 0)
            for part in PIECE_PARTS:
                got = report["times"]["piece_" + part]
                if got and e == 0:
                    row["piece_%s_us" % part] = median_us(got)
            if shim:
                stats.append(read_stats(a, "%s_e%d" % (tag, e), report["pid"]) or {})
        row["values_ok"] = bad == 0
        if shim:
            for k in ("vmm_imports", "vmm_import_hits", "vmm_maps", "vmm_map_hits", "vmm_access_skips"):
                row[k] = sum(st.get(k, 0) for st in stats)
        rows.append(row)
        print("alloc=%s shape=%s phase=%s cache=%s step_ms=%s steps_per_s=%s vmm_maps=%s vmm_map_hits=%s"
              " values_ok=%d" % (a.alloc, shape, label, row["cache"], row["step_ms_p50"], row["steps_per_s"],
                                 row.get("vmm_maps", "-"), row.get("vmm_map_hits", "-"), row["values_ok"]),
              flush=True)
    result = {"alloc": a.alloc, "rl_tensors": len(params), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0), "warmup": a.warmup, "shapes": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r["values_ok"] for r in rows) else 1


def spawn(ctx, device, shim, a, tag):
    """A consumer started with or without the shim; the environment is restored after."""
    saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "IPCCACHE_STATS_AT_EXIT", "IPCCACHE_STATS_FILE")}
    os.environ.pop("LD_PRELOAD", None)
    if shim:
        os.environ["LD_PRELOAD"] = a.shim
        if a.stats_dir:
            os.environ["IPCCACHE_STATS_AT_EXIT"] = "1"
            os.environ["IPCCACHE_STATS_FILE"] = os.path.join(a.stats_dir, "%s.%%p.json" % tag)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=consumer_main, args=(child, device))
    proc.start()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return proc, parent


def read_stats(a, tag, pid):
    path = os.path.join(a.stats_dir or "", "%s.%d.json" % (tag, pid))
    try:
        with open(path) as f:
            return json.loads(f.read().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def tag_of(a, label, device):
    return "%s_%s_d%d" % (a.alloc, label, device)


def run_phase(torch, a, pool, params, consumer, label, shim, device):
    """Serves one spawned consumer its features and steps; its figures."""
    proc, conn = consumer
    row = {"phase": label, "cache": "on" if shim else "off", "consumer_device": device}
    run_features(torch, pool, conn, a, busy=True)
    run_features(torch, pool, conn, a, busy=False)
    if params is not None:
        steps, shares, wall = run_rl(torch, params, conn, a)
        row.update(step_ms_p50=round(statistics.median(steps) * 1e3, 2),
                   share_ms_p50=round(statistics.median(shares) * 1e3, 2),
                   step_ms_p99=round(p99_us(steps) / 1e3, 2),
                   steps_per_s=round(len(steps) / wall, 2), steps=len(steps))
    report = request(conn, None, a.timeout)
    proc.join(a.timeout)
    t = report["times"]
    if t["rl_rebuild"]:
        row.update(rl_rebuild_ms_p50=round(statistics.median(t["rl_rebuild"]) * 1e3, 2),
                   rl_use_ms_p50=round(statistics.median(t["rl_use"]) * 1e3, 2),
                   rl_release_ms_p50=round(statistics.median(t["rl_release"]) * 1e3, 2))
    row.update(feature_us_p50=median_us(t["feature"]), feature_us_p99=p99_us(t["feature"]),
               rebuild_us_p50=median_us(t["rebuild"]), use_us_p50=median_us(t["use"]),
               release_us_p50=median_us(t["release"]), features=len(t["feature"]),
               idle_feature_us_p50=median_us(t["idle_feature"]),
               idle_feature_us_p99=p99_us(t["idle_feature"]),
               idle_rebuild_us_p50=median_us(t["idle_rebuild"]),
               idle_use_us_p50=median_us(t["idle_use"]),
               idle_release_us_p50=median_us(t["idle_release"]),
               values_ok=report["bad"] == 0, exitcode=proc.exitcode)
    if shim:
        row["stats"] = read_stats(a, tag_of(a, label, device), report["pid"])
    return row


def main(argv=None):
    a = parse_args(argv)
    if a.quick:
        a.layers, a.steps = min(a.layers, 4), min(a.steps, 8)
    if a.alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    os.environ.pop("LD_PRELOAD", None)  # the producer runs without the shim
    import torch
    import torch.multiprocessing as mp

    if a.stats_dir:
        os.makedirs(a.stats_dir, exist_ok=True)
    torch.cuda.set_device(0)
    pool = torch.zeros(a.pool_mb << 20, dtype=torch.uint8, device=0)
    params = None
    if a.steps > 0:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            params = [torch.zeros(s, dtype=torch.bfloat16, device=0) for s in model_shapes(a)]
        torch.cuda.synchronize()
    if a.shapes:
        return main_shapes(torch, mp, a, params)
    ctx = mp.get_context("spawn")
    devices = [int(d) for d in a.consumer_devices.split(",")]
    # Every consumer starts at once (start-up is the slow part) and waits for
    # its turn; they are served one at a time, so the timed work never overlaps.
    runs = [(label, shim, dev) for label, shim in PHASES for dev in devices]
    consumers = [spawn(ctx, dev, shim, a, tag_of(a, label, dev)) for label, shim, dev in runs]
    for _, conn in consumers:
        if not conn.poll(a.timeout) or conn.recv() != "ready":
            raise TimeoutError("a consumer did not start")
    rows = [run_phase(torch, a, pool, params, c, *run) for c, run in zip(consumers, runs)]
    result = {
        "alloc": a.alloc, "pool_mb": a.pool_mb, "feature_bytes": FEATURE_BYTES,
        "rl_tensors": len(params or []),
        "rl_bytes": sum(p.numel() * p.element_size() for p in params or []),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": rows,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    for r in rows:
        print("alloc=%s phase=%s cache=%s device=%d feature_us=%s idle_feature_us=%s rebuild_us=%s"
              " release_us=%s step_ms=%s steps_per_s=%s values_ok=%d"
              % (a.alloc, r["phase"], r["cache"], r["consumer_device"], r["feature_us_p50"],
                 r["idle_feature_us_p50"], r["rebuild_us_p50"], r["release_us_p50"], r.get("step_ms_p50"),
                 r.get("steps_per_s"), r["values_ok"]))
    return 0 if all(r["values_ok"] and r["exitcode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
