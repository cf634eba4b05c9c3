"""A Ray actor on the stand-in driver: run by tests/ray/test_ray.sh.

    ray_actor.py LIB STANDIN_DIR OPENS

Starts a one-node Ray cluster (no dashboard), then an actor whose
runtime_env gives it LD_PRELOAD=LIB and the stand-in driver's folder. The
actor reports whether the library is mapped in its own process (Ray starts
a worker for that runtime_env with those variables, so the loader preloads
it: nothing is injected later), opens one IPC handle OPENS times through
ctypes, as a Python program reaches the driver, and stays alive so that
ipccache-stats can ask it. Prints one JSON line: pid, preloaded, maps (the
stand-in's real maps), and a task's view without the runtime_env.
"""

import ctypes
import json
import os
import sys

import ray


def mapped(name):
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith("/" + name) for line in f)


def open_close(n):
    """cuInit, the primary context, then n opens and closes of one handle
    the stand-in made as if another process had exported it. (Defined here:
    Ray pickles the actor's code, and a ctypes type does not pickle.)"""

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]

    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for rc in (cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), 0),
               cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
               cuda.cuCtxSetCurrent(ctx)):
        assert rc == 0, rc
    h = Handle()
    cuda.fakecuda_make_foreign_handle(ctypes.byref(h), ctypes.c_uint64(1), ctypes.c_uint64(1 << 20))
    cuda.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), Handle, ctypes.c_uint]
    for _ in range(n):
        ptr = ctypes.c_uint64()
        assert cuda.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, 1) == 0
        assert cuda.cuIpcCloseMemHandle(ptr) == 0


@ray.remote
class Consumer:
    def run(self, n):
        open_close(n)
        return {"pid": os.getpid(), "preloaded": mapped("libipccache.so"),
                "env": os.environ.get("LD_PRELOAD", "")}


@ray.remote
def plain_task():
    return {"pid": os.getpid(), "preloaded": mapped("libipccache.so")}


def main(lib, standin, n):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # A task first: the worker pool's default workers exist before the actor.
    plain = ray.get(plain_task.remote())
    env = {"LD_PRELOAD": lib, "LD_LIBRARY_PATH": standin}
    actor = Consumer.options(runtime_env={"env_vars": env}).remote()
    got = ray.get(actor.run.remote(n))
    got["plain_task"] = plain
    print(json.dumps(got), flush=True)
    sys.stdin.readline()  # ipccache-stats asks the actor meanwhile
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
