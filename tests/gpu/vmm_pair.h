/*
 * vmm_pair.h - what the two-process VMM programs (vmm_errors.cu,
 * vmm_rebuild.c) share: an exporter forked before CUDA starts, talking over a
 * socket, and the allocation and access descriptions both sides use.
 * Header-only: each program is one translation unit built by nvcc or cc.
 */
#ifndef IPCCACHE_TESTS_GPU_VMM_PAIR_H
#define IPCCACHE_TESTS_GPU_VMM_PAIR_H

#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static inline void vmm_must(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        const char *name = "?";
        cuGetErrorName(rc, &name);
        fprintf(stderr, "vmm: %s failed: %s\n", what, name);
        exit(1);
    }
}

/* Device ordinal's primary context, current on this thread. */
static inline CUcontext vmm_start_cuda_on(int ordinal)
{
    CUdevice dev;
    CUcontext ctx;
    vmm_must(cuInit(0), "cuInit");
    vmm_must(cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    vmm_must(cuDevicePrimaryCtxRetain(&ctx, dev), "retain");
    vmm_must(cuCtxSetCurrent(ctx), "set current");
    return ctx;
}

static inline CUcontext vmm_start_cuda(void)
{
    return vmm_start_cuda_on(0);
}

/* Device memory on GPU 0, exportable as a POSIX fd (PyTorch's choice). */
static inline CUmemAllocationProp vmm_fd_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

static inline CUmemAccessDesc vmm_rw_on(int dev)
{
    CUmemAccessDesc d;
    memset(&d, 0, sizeof(d));
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

/* Forks the exporter, which runs exporter(its socket end) and exits with
 * its result; returns its pid and this side's socket in *sock. */
static inline pid_t vmm_fork_exporter(int (*exporter)(int sock), int *sock)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        exit(2);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        exit(exporter(sv[1]));
    }
    close(sv[1]);
    *sock = sv[0];
    return pid;
}

#endif
