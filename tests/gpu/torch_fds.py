#!/usr/bin/env python3
"""A PyTorch consumer holding a large expandable-segments share live at a soft limit of 1,024 open files.

The producer (main process, under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
allocates --tensors tensors of --tensor-mb MiB each (20 MiB chunks: 100 x 400 MiB
is 2,000 chunks, 40 GiB), fills each with its own value and puts them all on a
torch.multiprocessing Queue. The consumer (spawned) lowers its soft limit of open
files to --nofile first, as `ulimit -n 1024` would, then rebuilds every tensor
(per chunk: pidfd_getfd, import, close; reserve, map, set access), holds them all
live, checks every value, and then opens /dev/null 50 times: every open must
succeed. PyTorch closes each chunk's fd right after its import, so without
ipccache the consumer needs no fd per chunk; with it, the cache keeps at most an
eighth of the soft limit (docs/limits.md), and the rest go uncached.

The producer raises its own soft limit to the hard one (at most 65,536), as vLLM
and SGLang do: it keeps one exported fd per chunk.

Output (stdout), parsed by run.sh:
  producer_pid=<pid>  consumer_pid=<pid>  received=<n>  mismatches=<n>
  fds_open=<consumer's fds while holding everything>  opens_ok=<0|1>  values_ok=<0|1>
Exit status 0 only when every value matched and every open succeeded.
"""
import argparse
import os
import resource
import sys

from torch_consumer import abort, reap, start_consumer, value_for

OPENS = 50


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", type=int, default=100, help="tensors held at once (default 100)")
    p.add_argument("--tensor-mb", type=int, default=400,
                   help="MiB each, a multiple of the 20 MiB chunk (default 400)")
    p.add_argument("--nofile", type=int, default=1024, help="the consumer's soft limit (default 1024)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one reply")
    args = p.parse_args(argv)
    if args.tensors < 1 or args.tensor_mb < 1 or args.nofile < OPENS:
        p.error("need tensors >= 1, tensor-mb >= 1, nofile >= 50")
    return args


def set_soft_nofile(soft):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_fds():
    return len(os.listdir("/proc/self/fd")) - 1  # the listing's own


def own_opens():
    """The program's own opens while it holds the share: 1 when all succeed."""
    fds = []
    try:
        for _ in range(OPENS):
            fds.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        return 1
    except OSError as exc:
        print(f"torch_fds: open {len(fds) + 1} of {OPENS} failed: {exc}", file=sys.stderr)
        return 0
    finally:
        for fd in fds:
            os.close(fd)


def consumer(req_q, ack_q, nofile):
    """Spawned process: lower the limit, receive and hold everything, check, open, report."""
    set_soft_nofile(nofile)
    import torch

    torch.cuda.set_device(0)
    held = []
    while True:
        msg = req_q.get()
        if msg is None:
            break
        held.append(msg)  # (index, tensor): kept live
    # min and max: no tensor-sized temporary beside what is held
    bad = sum(0 if t.min().item() == t.max().item() == value_for(i) else 1 for i, t in held)
    fds = open_fds()
    opens_ok = own_opens()
    ack_q.put(("result", os.getpid(), len(held), bad, fds, opens_ok))
    req_q.get()  # the producer's go: drop everything only then
    del held


def main(argv=None):
    args = parse_args(argv)
    set_soft_nofile(65536)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    started = start_consumer("torch_fds", consumer, args.nofile)
    if not started:
        return 2
    proc, req_q, ack_q = started
    import torch
    n = args.tensor_mb << 20  # bytes of uint8
    tensors = []
    try:
        for i in range(args.tensors):
            t = torch.empty(n, dtype=torch.uint8, device="cuda:0")
            t.fill_(value_for(i))
            tensors.append(t)
        torch.cuda.synchronize(0)
        for i, t in enumerate(tensors):
            req_q.put((i, t))
        req_q.put(None)
        kind, pid, received, bad, fds, opens_ok = ack_q.get(timeout=args.timeout)
        if kind != "result" or pid != proc.pid:
            raise RuntimeError(f"unexpected reply {kind} from {pid}")
        req_q.put("go")
    except Exception as exc:  # queue.Empty on timeout, an allocation failure
        return abort("torch_fds", proc, exc)
    reap(proc, args.timeout)
    values_ok = received == args.tensors and bad == 0 and proc.exitcode == 0
    print(f"received={received}")
    print(f"mismatches={bad}")
    print(f"fds_open={fds}")
    print(f"opens_ok={opens_ok}")
    print(f"consumer_exit={proc.exitcode}")
    print(f"values_ok={int(values_ok)}")
    return 0 if values_ok and opens_ok else 1


if __name__ == "__main__":
    sys.exit(main())
