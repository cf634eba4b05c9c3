#!/usr/bin/env python3
"""SGLang's CUDA IPC multimodal transport, reproduced with PyTorch alone.

In SGLang the multimodal encoder process copies each request's features into a
preallocated CUDA pool and ships CUDA IPC handles of pool slices to the
scheduler process, which rebuilds every feature from its handle, uses it and
drops it. Every rebuild opens the pool's IPC handle (cudaIpcOpenMemHandle)
and every drop closes it again (cudaIpcCloseMemHandle), because nothing keeps
the mapping alive in between: that is the cost ipccache removes.

Here:
  producer (main process)  owns a --pool-mb CUDA uint8 pool; per request it
      writes --features features of ROWSxCOLS bf16 into the next ring slot of
      the pool and sends, per feature, the rebuild arguments that
      torch.multiprocessing.reductions.reduce_tensor gives for the slice.
  consumer (spawned)  per feature: rebuild_cuda_tensor (-> _new_shared_cuda ->
      cudaIpcOpenMemHandle), a small matmul, synchronize, check one value,
      drop (-> cudaIpcCloseMemHandle); then acks the request.

Latency is measured in the producer from submission (the scheduled time in
the fixed-rate phase) to the ack. Phases: warm-up, a burst of --requests
back to back, then --rate-requests at --rate requests/s.

The script measures ONE configuration; tools/bench/bench.sh runs it with and
without LD_PRELOAD of the shim (A/B/A). With --out it writes a JSON result;
if IPCCACHE_STATS_FILE (with %p) is set, the consumer's ipccache stats line
is included.
"""
import argparse
import json
import os
import platform
import sys
import threading
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pool-mb", type=int, default=512)
    p.add_argument("--features", type=int, default=4, help="features per request")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--cols", type=int, default=1280)
    p.add_argument("--requests", type=int, default=500, help="burst phase requests")
    p.add_argument("--rate", type=float, default=200.0, help="fixed-rate phase, requests/s")
    p.add_argument("--rate-requests", type=int, default=500, help="fixed-rate phase requests (0: skip)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--device-producer", type=int, default=0)
    p.add_argument("--device-consumer", type=int, default=0,
                   help="consumer's compute device; like SGLang, the handle is opened on the "
                        "producer's device and the feature is copied to this one")
    p.add_argument("--rebuild", choices=["rebuild_cuda_tensor", "new_shared_cuda"],
                   default="rebuild_cuda_tensor",
                   help="consumer path: torch's rebuild_cuda_tensor, or "
                        "UntypedStorage._new_shared_cuda directly as SGLang does")
    p.add_argument("--label", default="", help="free text stored in the result (e.g. on/off)")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one ack")
    args = p.parse_args(argv)
    feature_bytes = args.rows * args.cols * 2
    if args.features < 1 or feature_bytes * args.features > args.pool_mb << 20:
        p.error("one request's features must fit in the pool")
    if args.requests < 1 or args.warmup < 0 or args.rate_requests < 0 or args.rate <= 0:
        p.error("bad request counts or rate")
    return args


# ----------------------------------------------------------------- helpers

def percentile(sorted_vals, q):
    """Nearest-rank percentile of an already sorted list (q in [0, 100])."""
    if not sorted_vals:
        return float("nan")
    idx = round(q / 100.0 * (len(sorted_vals) - 1))
    return sorted_vals[min(max(idx, 0), len(sorted_vals) - 1)]


def summarize(latencies_s, elapsed_s):
    """Throughput and latency figures (ms) of one phase."""
    lat = sorted(x * 1e3 for x in latencies_s)
    n = len(lat)
    return {
        "requests": n,
        "elapsed_s": elapsed_s,
        "req_per_s": n / elapsed_s if elapsed_s > 0 else float("nan"),
        "lat_mean_ms": sum(lat) / n if n else float("nan"),
        "lat_p50_ms": percentile(lat, 50),
        "lat_p99_ms": percentile(lat, 99),
        "lat_max_ms": lat[-1] if lat else float("nan"),
    }


def feature_value(req_id, feat):
    """A small integer, exact in bf16, that differs between neighbouring requests."""
    return float((req_id * 7 + feat) % 97 + 1)


def shim_active():
    pre = os.environ.get("LD_PRELOAD", "")
    return "ipccache" in pre and os.environ.get("IPCCACHE_DISABLE", "0") in ("", "0")


def read_stats(pid):
    """The last ipccache stats line of process `pid`, or None."""
    tmpl = os.environ.get("IPCCACHE_STATS_FILE", "")
    if "%p" not in tmpl:
        return None
    try:
        with open(tmpl.replace("%p", str(pid))) as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


class Ring:
    """Request-sized slots of the pool, reused in order (acks arrive in order)."""

    def __init__(self, pool_bytes, request_bytes):
        self.request_bytes = request_bytes
        self.slots = pool_bytes // request_bytes

    def offset(self, req_id):
        return (req_id % self.slots) * self.request_bytes


# ----------------------------------------------------------------- consumer

def consumer_main(req_q, ack_q, args):
    """Spawned "scheduler": rebuild, use, drop, ack."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    torch.cuda.set_device(args.device_consumer)
    weight = torch.randn(args.cols, 64, dtype=torch.bfloat16, device=f"cuda:{args.device_consumer}")
    cross = args.device_consumer != args.device_producer
    processed = mismatches = 0
    # Per feature: the rebuild (opens the handle) and the drop (closes it),
    # timed apart from the GPU op, i.e. what the cache changes.
    rebuild_ns, release_ns = [], []

    def rebuild(rebuild_args):
        if args.rebuild == "rebuild_cuda_tensor":
            return rebuild_cuda_tensor(*rebuild_args)
        return rebuild_like_sglang(torch, rebuild_args)

    while True:
        msg = req_q.get()
        if msg is None:
            break
        req_id, feats = msg
        for f, rebuild_args in enumerate(feats):
            t0 = time.perf_counter_ns()
            feat = rebuild(rebuild_args)
            rebuild_ns.append(time.perf_counter_ns() - t0)
            x = feat.to(f"cuda:{args.device_consumer}") if cross else feat
            x @ weight  # the small GPU op; only its cost matters
            torch.cuda.synchronize(args.device_consumer)
            if float(x[-1, -1]) != feature_value(req_id, f):
                mismatches += 1
            # Dropping the last reference closes the IPC mapping (no cache in
            # torch beyond live storages), as in SGLang's scheduler.
            t0 = time.perf_counter_ns()
            del feat, x
            release_ns.append(time.perf_counter_ns() - t0)
        processed += 1
        ack_q.put(("ack", req_id))
    ack_q.put(("result", {"pid": os.getpid(), "processed": processed, "mismatches": mismatches,
                          "rebuild_us_p50": median_us(rebuild_ns),
                          "release_us_p50": median_us(release_ns)}))


def median_us(samples_ns):
    """Median of nanosecond samples, in microseconds (None when empty)."""
    if not samples_ns:
        return None
    ordered = sorted(samples_ns)
    return ordered[len(ordered) // 2] / 1000.0


def rebuild_like_sglang(torch, rebuild_args):
    """SGLang's CudaIpcTensorTransportProxy path: _new_shared_cuda + set_.

    rebuild_args is reduce_tensor's tuple for a CUDA tensor: (tensor_cls, size,
    stride, offset, storage_cls, dtype, device, handle, size_bytes,
    offset_bytes, requires_grad, ref_counter_handle, ref_counter_offset,
    event_handle, event_sync_required).
    """
    (_cls, size, stride, offset, _scls, dtype, device, handle, size_bytes, offset_bytes,
     _rg, rc_handle, rc_offset, ev_handle, ev_sync) = rebuild_args
    storage = torch.UntypedStorage._new_shared_cuda(
        device, handle, size_bytes, offset_bytes, rc_handle, rc_offset, ev_handle, ev_sync)
    return torch.empty(0, dtype=dtype, device=f"cuda:{device}").set_(
        storage, storage_offset=offset, size=size, stride=stride)


# ----------------------------------------------------------------- producer

class AckCollector(threading.Thread):
    """Records when each request's ack arrives; wakes a producer that waits for a free slot."""

    def __init__(self, ack_q):
        super().__init__(daemon=True)
        self.ack_q = ack_q
        self.cond = threading.Condition()
        self.ack_time = {}
        self.acked = 0
        self.result = None
        self.error = None

    def run(self):
        while True:
            try:
                kind, payload = self.ack_q.get()
            except Exception as exc:  # queue broken: consumer died
                self.error = exc
                kind, payload = "error", None
            with self.cond:
                if kind == "ack":
                    self.ack_time[payload] = time.perf_counter()
                    self.acked += 1
                elif kind == "result":
                    self.result = payload
                self.cond.notify_all()
            if kind != "ack":
                return

    def wait_until(self, pred, timeout):
        with self.cond:
            if not self.cond.wait_for(pred, timeout):
                raise TimeoutError("consumer did not answer in time")


class Producer:
    def __init__(self, args, req_q, collector):
        import torch
        from torch.multiprocessing.reductions import reduce_tensor

        self.torch, self.reduce_tensor = torch, reduce_tensor
        self.args, self.req_q, self.acks = args, req_q, collector
        self.dev = f"cuda:{args.device_producer}"
        self.feature_bytes = args.rows * args.cols * 2
        self.pool = torch.empty(args.pool_mb << 20, dtype=torch.uint8, device=self.dev)
        self.ring = Ring(self.pool.numel(), self.feature_bytes * args.features)
        self.next_id = 0

    def submit(self, req_id):
        """Writes the request's features into its ring slot and sends their handles."""
        base = self.ring.offset(req_id)
        feats = []
        for f in range(self.args.features):
            lo = base + f * self.feature_bytes
            view = self.pool[lo:lo + self.feature_bytes].view(self.torch.bfloat16)
            feat = view.view(self.args.rows, self.args.cols)
            feat.fill_(feature_value(req_id, f))
            # What SGLang sends: the storage's IPC handle plus the view's
            # geometry; torch records an IPC event so the consumer waits for
            # the fill without a host synchronization here.
            feats.append(self.reduce_tensor(feat)[1])
        self.req_q.put((req_id, feats))

    def wait_slot(self, req_id):
        """A slot is reused only after the request that used it was acked."""
        need = req_id - self.ring.slots + 1
        if need > self.acks.acked:
            self.acks.wait_until(lambda: self.acks.acked >= need or self.acks.result is not None,
                                 self.args.timeout)

    def phase(self, n, rate=None):
        """Runs n requests (back to back, or at `rate`/s); returns their summary."""
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        sched = {}
        t_start = time.perf_counter()
        for k, req_id in enumerate(ids):
            if rate:
                due = t_start + k / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            self.wait_slot(req_id)
            # Fixed rate: latency counts from the scheduled time, so that a
            # backlog shows up as latency (no coordinated omission).
            sched[req_id] = t_start + k / rate if rate else time.perf_counter()
            self.submit(req_id)
        last = ids[-1]
        self.acks.wait_until(lambda: last in self.acks.ack_time or self.acks.result is not None,
                             self.args.timeout + n / (rate or 1e9))
        missing = [i for i in ids if i not in self.acks.ack_time]
        if missing:
            raise RuntimeError(f"{len(missing)} requests were never acked")
        end = max(self.acks.ack_time[i] for i in ids)
        return summarize([self.acks.ack_time[i] - sched[i] for i in ids], end - t_start)


def machine_info(torch, args):
    info = {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "producer_gpu": torch.cuda.get_device_name(args.device_producer),
        "consumer_gpu": torch.cuda.get_device_name(args.device_consumer),
        "device_count": torch.cuda.device_count(),
    }
    return info


def run(args):
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        raise SystemExit("bench_sglang_pattern: CUDA not available")
    ctx = mp.get_context("spawn")
    req_q, ack_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer_main, args=(req_q, ack_q, args))
    proc.start()
    collector = AckCollector(ack_q)
    collector.start()
    result = {"label": args.label, "shim": shim_active(), "ld_preload": os.environ.get("LD_PRELOAD", ""),
              "config": vars(args).copy(), "consumer_pid": proc.pid, "phases": {}}
    ok = False
    try:
        producer = Producer(args, req_q, collector)
        result["ring_slots"] = producer.ring.slots
        if args.warmup:
            producer.phase(args.warmup)
        result["phases"]["burst"] = producer.phase(args.requests)
        if args.rate_requests:
            result["phases"]["rate"] = producer.phase(args.rate_requests, rate=args.rate)
        ok = True
    except (RuntimeError, TimeoutError) as exc:
        print(f"bench_sglang_pattern: {exc}", file=sys.stderr)
    finally:
        req_q.put(None)
        proc.join(args.timeout)
        collector.join(5)  # its final message came before the consumer exited
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    result["consumer"] = collector.result
    result["consumer_exit"] = proc.exitcode
    result["consumer_stats"] = read_stats(proc.pid)
    result["machine"] = machine_info(torch, args)
    consumer_ok = bool(collector.result) and collector.result["mismatches"] == 0 and proc.exitcode == 0
    result["ok"] = ok and consumer_ok
    return result


def print_summary(res):
    tag = f"[{res['label'] or ('shim' if res['shim'] else 'no-shim')}]"
    for name, ph in res["phases"].items():
        print(f"{tag} {name}: {ph['requests']} req, {ph['req_per_s']:.1f} req/s, "
              f"latency mean {ph['lat_mean_ms']:.3f} ms p50 {ph['lat_p50_ms']:.3f} ms "
              f"p99 {ph['lat_p99_ms']:.3f} ms")
    st = res.get("consumer_stats")
    if st:
        print(f"{tag} consumer ipccache: opens={st.get('opens')} hits={st.get('hits')} "
              f"real_opens={st.get('real_opens')} real_closes={st.get('real_closes')}")
    print(f"{tag} consumer_pid={res['consumer_pid']} ok={int(res['ok'])}")


def main(argv=None):
    args = parse_args(argv)
    res = run(args)
    print_summary(res)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2, sort_keys=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
