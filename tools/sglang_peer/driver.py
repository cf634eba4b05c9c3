#!/usr/bin/env python3
"""SGLang's own CUDA IPC multimodal transport, driven feature by feature.

Unlike tools/bench/bench_sglang_pattern.py (a re-creation with PyTorch alone), this
runs SGLang's classes from sglang.srt.multimodal.transport.cuda_ipc: a spawned
producer owns SGLang's MmItemMemoryPool and wraps each feature with
pool.wrap_tensor (a CudaIpcTensorTransportProxy); a spawned consumer calls
proxy.reconstruct_on_target_device, checks every value of the feature and
drops it. Timed per feature in the consumer: reconstruct + check + release.

Each configuration is one fresh producer/consumer pair:
  legacy | expandable    PyTorch's allocator in both processes (expandable:
                         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
  off | on               SGLang's own pool-handle cache (use_pool_handle_cache)
The library is not chosen here: run the whole driver without and with
LD_PRELOAD (tools/peer_suites.sh, tools/bench/bench.sh do). When IPCCACHE_STATS_FILE
holds %p and the consumer ran with the library, its stats line at exit gives
the consumer's legacy opens and VMM imports, and how many of them were hits.

usage:
  driver.py run [options]           one line per configuration; exit 1 when a
                                    configuration failed or a value was wrong
  driver.py report WITHOUT WITH [WITHOUT2]   Markdown table of --out files
SGLang must be importable (tools/peer_suites.sh prepares the fetched copy).
"""
import argparse
import json
import os
import sys
import time

CONFIGS = ("legacy:off", "legacy:on", "expandable:off", "expandable:on")
SOURCES = 8  # distinct source tensors the producer cycles through


def parse_args(argv):
    p = argparse.ArgumentParser(prog="driver.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="drive SGLang's transport")
    run.add_argument("--features", type=int, default=500, help="timed features per configuration")
    run.add_argument("--warmup", type=int, default=20, help="untimed features first")
    run.add_argument("--rows", type=int, default=1024)
    run.add_argument("--cols", type=int, default=1280)
    run.add_argument("--pool-mb", type=int, default=512,
                     help="the pool (SGLang sizes it from SGLANG_MM_FEATURE_CACHE_MB, split among its tokenizer workers)")
    run.add_argument("--device", type=int, default=0)
    run.add_argument("--configs", default=",".join(CONFIGS),
                     help="comma-separated ALLOC:CACHE, ALLOC legacy|expandable, CACHE off|on")
    run.add_argument("--timeout", type=float, default=120.0, help="seconds per configuration")
    run.add_argument("--out", help="write the results as JSON here")
    rep = sub.add_parser("report", help="Markdown table from --out files")
    rep.add_argument("files", nargs="+", help="without, with[, without again]")
    args = p.parse_args(argv)
    if args.cmd == "run":
        if args.features < 1 or args.warmup < 0 or args.rows < 1 or args.cols < 1:
            p.error("--features, --rows and --cols must be positive, --warmup not negative")
        if args.rows * args.cols * 2 * 2 > args.pool_mb << 20:
            p.error("two features must fit in the pool")
        configs = args.configs.split(",")
        bad = [c for c in configs if c not in CONFIGS]
        if bad:
            p.error(f"unknown configuration {bad[0]!r}: choose from {', '.join(CONFIGS)}")
        args.configs = configs
    elif not 2 <= len(args.files) <= 3:
        p.error("report takes two or three files")
    return args


def feature_value(index):
    """A small integer, exact in bf16, different for neighbouring features."""
    return float(index % SOURCES + 1)


def median(sorted_vals):
    return sorted_vals[len(sorted_vals) // 2] if sorted_vals else None


def read_stats(pid):
    """The last ipccache stats line process `pid` wrote, or None."""
    template = os.environ.get("IPCCACHE_STATS_FILE", "")
    if "%p" not in template:
        return None
    try:
        with open(template.replace("%p", str(pid)), encoding="utf-8") as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------- producer

def producer_main(args, cache_on, feature_q, done):
    """SGLang's tokenizer-worker side: its pool, its proxies."""
    import torch
    from sglang.srt.multimodal.transport.cuda_ipc import (
        MM_ITEM_MEMORY_POOL_RECYCLE_INTERVAL,
        MmItemMemoryPool,
    )

    torch.cuda.set_device(args.device)
    # SGLang's own recycling interval: its recycler's GPU reads share the GPU
    # with the consumer, as in the engine.
    pool = MmItemMemoryPool(memory_size=args.pool_mb << 20,
                            recycle_interval=MM_ITEM_MEMORY_POOL_RECYCLE_INTERVAL,
                            base_gpu_id=args.device, consumer_count=1)
    sources = [torch.full((args.rows, args.cols), feature_value(i), dtype=torch.bfloat16,
                          device=f"cuda:{args.device}") for i in range(SOURCES)]
    try:
        for index in range(args.warmup + args.features):
            proxy = pool.wrap_tensor(sources[index % SOURCES], use_pool_handle_cache=cache_on)
            while proxy is None:  # the pool is full until the consumer's acks recycle it
                if done.is_set():  # the consumer is gone: nothing will be recycled
                    return
                time.sleep(0.0005)
                proxy = pool.wrap_tensor(sources[index % SOURCES], use_pool_handle_cache=cache_on)
            feature_q.put((index, proxy))
            del proxy
        feature_q.put(None)
        done.wait(args.timeout)
    finally:
        pool.shutdown()


# ----------------------------------------------------------------- consumer

def consumer_main(args, feature_q, result_q):
    """SGLang's scheduler side: reconstruct, use, release."""
    import torch
    import sglang.srt.multimodal.transport.cuda_ipc  # noqa: F401  (unpickling needs it)

    torch.cuda.set_device(args.device)
    torch.ones(1, device=f"cuda:{args.device}").sum().item()  # context up before timing
    samples, wrong = [], 0
    while True:
        msg = feature_q.get(timeout=args.timeout)
        if msg is None:
            break
        index, proxy = msg
        t0 = time.perf_counter_ns()
        feature = proxy.reconstruct_on_target_device(args.device)
        right = bool((feature == feature_value(index)).all())
        del feature, proxy  # the last reference: an uncached mapping closes here
        elapsed = time.perf_counter_ns() - t0
        wrong += not right
        if index >= args.warmup:
            samples.append(elapsed)
    result_q.put({"pid": os.getpid(), "features": len(samples), "wrong_values": wrong,
                  "samples_ns": samples})


# ----------------------------------------------------------------- main

def wait_result(result_q, procs, timeout):
    """The consumer's result, or None once the time is up or a child died
    without one (an import error must not cost the whole timeout)."""
    import queue

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return result_q.get(timeout=0.5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                try:
                    return result_q.get(timeout=1)  # sent just before it died
                except queue.Empty:
                    return None
    return None


def run_config(args, config):
    """One fresh producer/consumer pair; its result as a dict."""
    import multiprocessing as mp

    alloc, cache = config.split(":")
    # Spawned children take the environment as it is at start: the allocator
    # setting must be there before their first CUDA call.
    saved = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    ctx = mp.get_context("spawn")
    feature_q, result_q, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    producer = ctx.Process(target=producer_main, args=(args, cache == "on", feature_q, done))
    consumer = ctx.Process(target=consumer_main, args=(args, feature_q, result_q))
    producer.start()
    consumer.start()
    if saved is None:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = saved
    result = {"config": config, "alloc": alloc, "sglang_cache": cache, "error": None}
    got = wait_result(result_q, (consumer, producer), args.timeout)
    if got is None:
        result["error"] = "no result from the consumer"
    done.set()
    consumer.join(args.timeout)
    producer.join(args.timeout)
    for proc in (consumer, producer):
        if proc.is_alive():
            proc.terminate()
            proc.join(10)
    if got:
        samples = sorted(got.pop("samples_ns"))
        result.update(got)
        result["median_us"] = median(samples) / 1000.0 if samples else None
        result["p90_us"] = samples[int(len(samples) * 0.9)] / 1000.0 if samples else None
        result["stats"] = read_stats(got["pid"])
    if result["error"] is None and (consumer.exitcode or producer.exitcode):
        result["error"] = f"exit status consumer {consumer.exitcode}, producer {producer.exitcode}"
    return result


def describe(r):
    if r["error"]:
        return f"sglang-driver: {r['config']}: FAILED: {r['error']}"
    line = (f"sglang-driver: {r['alloc']} allocator, SGLang's cache {r['sglang_cache']}: "
            f"{r['features']} features, median {r['median_us']:.1f} us, p90 {r['p90_us']:.1f} us, "
            f"wrong values {r['wrong_values']}")
    s = r.get("stats")
    if s:
        line += (f"; consumer: legacy opens {s.get('opens', 0)} ({s.get('hits', 0)} hits), "
                 f"VMM imports {s.get('vmm_imports', 0)} ({s.get('vmm_import_hits', 0)} hits)")
    return line


def record(config, passed):
    """The outcome for tools/peer_record.py's comparison (PEER_RECORD)."""
    path = os.environ.get("PEER_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"sglang_driver::{config}\t{'passed' if passed else 'failed'}\n")


def cmd_run(args):
    results, failed = [], 0
    for config in args.configs:
        r = run_config(args, config)
        passed = r["error"] is None and r["wrong_values"] == 0 and r["features"] == args.features
        failed += not passed
        record(config, passed)
        print(describe(r), flush=True)
        results.append(r)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"preload": os.environ.get("LD_PRELOAD", ""), "features": args.features,
                       "rows": args.rows, "cols": args.cols, "pool_mb": args.pool_mb,
                       "results": results}, f, indent=1)
    print(f"sglang-driver: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def fmt_us(r):
    return "failed" if r is None or r.get("median_us") is None else f"{r['median_us']:,.0f} µs"


def hits(r):
    s = (r or {}).get("stats") or {}
    if r and r["alloc"] == "expandable":
        return f"{s.get('vmm_import_hits', 0):,} of {s.get('vmm_imports', 0):,} imports"
    return f"{s.get('hits', 0):,} of {s.get('opens', 0):,} opens"


def cmd_report(args):
    runs = []
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            runs.append({r["config"]: r for r in json.load(f)["results"]})
    without, with_lib = runs[0], runs[1]
    again = runs[2] if len(runs) == 3 else {}
    print("| SGLang's code: allocator, SGLang's cache | without ipccache | with ipccache "
          "| consumer's hits (with) |")
    print("| --- | --- | --- | --- |")
    for config in CONFIGS:
        if config not in without and config not in with_lib:
            continue
        alloc, cache = config.split(":")
        base = fmt_us(without.get(config))
        if config in again:
            base += f" / {fmt_us(again[config])}"
        print(f"| {alloc}, cache {cache} | {base} | {fmt_us(with_lib.get(config))} "
              f"| {hits(with_lib.get(config))} |")
    return 0


def main(argv):
    args = parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
