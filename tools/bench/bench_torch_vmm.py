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
