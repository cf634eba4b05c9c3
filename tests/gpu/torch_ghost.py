#!/usr/bin/env python3
"""PyTorch check that an exporter's freed memory comes back (tests/gpu/run.sh).

The producer allocates a tensor (1 GiB by default) and shares it with a
spawned consumer through a torch.multiprocessing Queue; the consumer rebuilds
it (cudaIpcOpenMemHandle), reads it, drops it (cudaIpcCloseMemHandle: with
ipccache the mapping stays cached, idle) and stays alive. The producer then
deletes the tensor, collects the IPC bookkeeping and empties its caching
allocator (cudaFree), and reads the GPU's free memory before and after.

Output (stdout), parsed by run.sh:
  consumer_pid=<pid> size=<bytes> freed=<bytes> ok=<0|1>
ok=1 when the free gave back the tensor's bytes within 64 MiB, as it does
without ipccache.
"""
import argparse
import sys

SLACK = 64 << 20


def consumer(queue, replies):
    import os
    import torch
    t = queue.get()                  # rebuild: opens the IPC handle
    value = float(t[0].item())
    del t                            # the storage dies: the handle is closed
    torch.cuda.synchronize()
    replies.put((os.getpid(), value))
    queue.get()                      # stay alive until the producer has measured


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024, help="tensor size in MiB (default 1024)")
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args(argv)

    import torch
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    size = args.mib << 20
    t = torch.ones(size // 4, dtype=torch.float32, device="cuda")
    queue, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(queue, replies))
    proc.start()
    queue.put(t)
    pid, value = replies.get(timeout=args.timeout)

    before = torch.cuda.mem_get_info()[0]
    del t
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()         # the consumer has released its reference
    torch.cuda.empty_cache()         # cudaFree of the segment
    after = torch.cuda.mem_get_info()[0]
    queue.put(None)
    proc.join(args.timeout)

    freed = after - before
    ok = value == 1.0 and abs(freed - size) <= SLACK and proc.exitcode == 0
    print(f"consumer_pid={pid} size={size} freed={freed} ok={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
