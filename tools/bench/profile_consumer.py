#!/usr/bin/env python3
"""Where a cached PyTorch consumer's time goes: perf record of one consumer.

The producer (this process, without the library) owns a 512 MiB pool on GPU
0 and sends 1 MiB slices of it, the pool filled once (bench_torch_vmm.py's
"idle" pass); one consumer, spawned with the library preloaded, rebuilds,
copies and drops each. After --warmup features, `perf record -g -p` samples
the consumer alone for --features more. Then read the profile with e.g.

  perf report -i OUT --no-children --sort dso,sym --stdio     (self time)
  perf report -i OUT --children --sort sym -g none --stdio    (inclusive)

Needs perf and permission to profile one's own processes.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch_vmm as bench  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alloc", choices=["legacy", "expandable"], required=True)
    p.add_argument("--device", type=int, default=0, help="the consumer's GPU")
    p.add_argument("--shim", required=True, help="the library preloaded into the consumer")
    p.add_argument("--perf", default="perf", help="the perf command")
    p.add_argument("--out", required=True, help="perf's data file")
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--features", type=int, default=4000)
    p.add_argument("--rate", type=int, default=20000, help="samples per second")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    args = bench.parse_args(["--alloc", a.alloc, "--shim", a.shim, "--features", str(a.warmup),
                             "--steps", "0", "--warmup", "0"])
    if a.alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch
    import torch.multiprocessing as mp

    torch.cuda.set_device(0)
    pool = torch.zeros(512 << 20, dtype=torch.uint8, device=0)
    proc, conn = bench.spawn(mp.get_context("spawn"), a.device, True, args, "profile")
    if not conn.poll(args.timeout) or conn.recv() != "ready":
        raise TimeoutError("the consumer did not start")
    bench.run_features(torch, pool, conn, args, busy=False)
    perf = subprocess.Popen([a.perf, "record", "-F", str(a.rate), "-g", "-p", str(proc.pid),
                             "-o", a.out], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(2)  # perf attaches
    args.features = a.features
    begun = time.perf_counter()
    bench.run_features(torch, pool, conn, args, busy=False)
    wall = time.perf_counter() - begun
    perf.send_signal(signal.SIGINT)
    perf.wait()
    report = bench.request(conn, None, args.timeout)
    proc.join(args.timeout)
    timed = report["times"]["idle_feature"][a.warmup:]
    print("alloc=%s device=%d features=%d wall_per_feature_us=%.1f consumer_median_us=%.1f"
          % (a.alloc, a.device, a.features, wall / a.features * 1e6,
             statistics.median(timed) * 1e6))
    return 0 if report["bad"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
