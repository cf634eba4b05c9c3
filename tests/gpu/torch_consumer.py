#!/usr/bin/env python3
"""Two-process PyTorch CUDA IPC check for ipccache (tests/gpu/run.sh).

The main process (producer) owns a CUDA uint8 pool. For each iteration it
writes a new value into one slice of the pool and puts the slice on a
torch.multiprocessing Queue; pickling it goes through reduce_tensor, and the
consumer's unpickling through rebuild_cuda_tensor -> _new_shared_cuda ->
cudaIpcOpenMemHandle. The consumer (a spawned process) checks that it sees the
value just written, drops the tensor (which closes the IPC mapping again:
cudaIpcCloseMemHandle), and acks. Every slice lies in the same allocation, so
all messages carry the same IPC handle: with ipccache the consumer should
make one real open and N-1 cache hits.

With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the pool is an
expandable segment instead, and every message makes the consumer rebuild it
through the VMM calls (import per chunk, reserve, map, set-access) and release
it: with ipccache, one real import per chunk and the rest hits (run.sh checks
both ways).

Torch's rule for sharing CUDA tensors is that the producer keeps the memory
alive while the consumer uses it: the pool lives for the whole run and the
producer waits for each ack before writing the next value.

Output (stdout), parsed by run.sh:
  producer_pid=<pid>  consumer_pid=<pid>  received=<n>  values_ok=<0|1>
Exit status 0 only when every value matched.
"""
import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=50, help="messages to send (default 50)")
    p.add_argument("--pool-mb", type=int, default=64, help="pool size in MiB (default 64)")
    p.add_argument("--slice-kb", type=int, default=1024, help="slice size in KiB (default 1024)")
    p.add_argument("--device-producer", type=int, default=0)
    p.add_argument("--device-consumer", type=int, default=0,
                   help="consumer's current device; torch opens the handle on the "
                        "producer's device index and the consumer copies from there")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one reply")
    args = p.parse_args(argv)
    if args.iters < 1 or args.slice_kb < 1 or args.pool_mb * 1024 < args.slice_kb:
        p.error("need iters >= 1 and 1 KiB <= slice <= pool")
    return args


def value_for(i):
    """Value written in iteration i: never 0 (the pool starts zeroed), changes every time."""
    return i % 251 + 1


def slice_bounds(i, pool_bytes, slice_bytes):
    """Slices rotate through the pool so the offset inside the mapping varies."""
    nslices = pool_bytes // slice_bytes
    start = (i * 7 % nslices) * slice_bytes
    return start, start + slice_bytes


def consumer(req_q, ack_q, device):
    """Spawned process: receive, check, drop, ack; finally report."""
    import torch

    torch.cuda.set_device(device)
    received = 0
    bad = 0
    while True:
        msg = req_q.get()
        if msg is None:
            break
        i, tensor = msg
        received += 1
        local = tensor if tensor.device.index == device else tensor.to(device)
        ok = bool((local == value_for(i)).all().item())
        bad += 0 if ok else 1
        # Drop every reference before acking: the storage's deleter closes the
        # IPC mapping (cudaIpcCloseMemHandle), so the next message opens again.
        del msg, tensor, local
        ack_q.put(("ack", i, ok))
    ack_q.put(("result", os.getpid(), received, bad))


def produce(args, req_q, ack_q):
    """Main-process loop; returns (received, bad, consumer_pid) or raises on timeout."""
    import torch

    pool_bytes = args.pool_mb << 20
    slice_bytes = args.slice_kb << 10
    pool = torch.zeros(pool_bytes, dtype=torch.uint8, device=f"cuda:{args.device_producer}")
    for i in range(args.iters):
        lo, hi = slice_bounds(i, pool_bytes, slice_bytes)
        piece = pool[lo:hi]
        piece.fill_(value_for(i))
        # torch also passes an IPC event for ordering; synchronizing here keeps
        # the check about ipccache, not about event handling.
        torch.cuda.synchronize(args.device_producer)
        req_q.put((i, piece))
        kind, j, _ok = ack_q.get(timeout=args.timeout)
        if kind != "ack" or j != i:
            raise RuntimeError(f"unexpected reply {kind} {j} for message {i}")
        del piece
    req_q.put(None)
    kind, pid, received, bad = ack_q.get(timeout=args.timeout)
    if kind != "result":
        raise RuntimeError(f"unexpected final reply {kind}")
    return received, bad, pid


def start_consumer(prog, target, *args):
    """Spawns target(req_q, ack_q, *args) and prints both pids; None (said why)
    without CUDA."""
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        print(f"{prog}: CUDA not available", file=sys.stderr)
        return None
    ctx = mp.get_context("spawn")
    req_q, ack_q = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=target, args=(req_q, ack_q) + args)
    proc.start()
    print(f"producer_pid={os.getpid()}", flush=True)
    print(f"consumer_pid={proc.pid}", flush=True)
    return proc, req_q, ack_q


def abort(prog, proc, exc):
    """The producer's side failed: say why, stop the consumer, report no values."""
    print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
    proc.kill()
    proc.join()
    print("values_ok=0")
    return 1


def reap(proc, timeout):
    """Waits for the consumer to end, killing it after timeout seconds."""
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


def main(argv=None):
    args = parse_args(argv)
    started = start_consumer("torch_consumer", consumer, args.device_consumer)
    if not started:
        return 2
    proc, req_q, ack_q = started
    try:
        received, bad, pid = produce(args, req_q, ack_q)
    except Exception as exc:  # queue.Empty on timeout, or a protocol error
        return abort("torch_consumer", proc, exc)
    reap(proc, args.timeout)
    values_ok = received == args.iters and bad == 0 and proc.exitcode == 0
    if pid != proc.pid:
        print(f"torch_consumer: consumer reported pid {pid}, expected {proc.pid}", file=sys.stderr)
    print(f"received={received}")
    print(f"mismatches={bad}")
    print(f"consumer_exit={proc.exitcode}")
    print(f"values_ok={int(values_ok)}")
    return 0 if values_ok else 1


if __name__ == "__main__":
    sys.exit(main())
