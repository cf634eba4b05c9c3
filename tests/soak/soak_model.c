/*
 * soak_model.c - the shadow model's answers and the checks against them
 * (soak_model.h says what the driver answers).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_vmm.h"
#include "soak_model.h"

#define DESCRIBED 10 /* differences described per process */

static _Atomic int described;

CUresult soak_model_rc(enum soak_call call)
{
    switch (call) {
    case SOAK_OPEN_BAD_FLAGS:
    case SOAK_OPEN_CORRUPT:
    case SOAK_CLOSE_AGAIN:
    case SOAK_CLOSE_BOGUS:
        return CUDA_ERROR_INVALID_VALUE;
    default:
        return CUDA_SUCCESS;
    }
}

__attribute__((format(printf, 1, 2))) static void describe(const char *fmt, ...)
{
    if (atomic_fetch_add(&described, 1) >= DESCRIBED)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "soak: importer %d: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int soak_check_rc(struct soak_counts *c, enum soak_call call, CUresult got, const char *what)
{
    CUresult want = soak_model_rc(call);
    atomic_fetch_add_explicit(&c->checks, 1, memory_order_relaxed);
    if (got == want)
        return 1;
    atomic_fetch_add_explicit(&c->rc_mismatch, 1, memory_order_relaxed);
    describe("%s returned %d, the model says %d", what, (int)got, (int)want);
    return 0;
}

int soak_check_open(struct soak_counts *c, CUresult got, uint64_t exporter_pid, const char *what)
{
    if (got == CUDA_ERROR_INVALID_HANDLE && !fakecuda_process_runs((int64_t)exporter_pid)) {
        atomic_fetch_add_explicit(&c->checks, 1, memory_order_relaxed);
        return 0; /* its exporter exited: refused where the process maps it no more */
    }
    return soak_check_rc(c, SOAK_OPEN, got, what);
}

static int check_pair(struct soak_counts *c, int found, uint64_t pid, uint64_t serial,
                      uint64_t want_pid, uint64_t want_serial, const char *what, CUdeviceptr ptr)
{
    atomic_fetch_add_explicit(&c->checks, 1, memory_order_relaxed);
    if (found && pid == want_pid && serial == want_serial)
        return 1;
    atomic_fetch_add_explicit(&c->wrong, 1, memory_order_relaxed);
    describe("%s at 0x%llx holds %s%llu/%llu, the model says %llu/%llu", what,
             (unsigned long long)ptr, found ? "" : "nothing: ", (unsigned long long)pid,
             (unsigned long long)serial, (unsigned long long)want_pid,
             (unsigned long long)want_serial);
    return 0;
}

int soak_check_value(struct soak_counts *c, CUdeviceptr ptr, uint64_t pid, uint64_t serial,
                     const char *what)
{
    uint64_t p = 0, s = 0;
    int found = fakecuda_ipc_allocation_at(ptr, &p, &s);
    return check_pair(c, found, p, s, pid, serial, what, ptr);
}

int soak_check_vmm_value(struct soak_counts *c, CUdeviceptr ptr, uint64_t pid, uint64_t serial)
{
    uint64_t p = 0, s = 0;
    int found = fakevmm_allocation_at(ptr, &p, &s);
    return check_pair(c, found, p, s, pid, serial, "a VMM mapping", ptr);
}

int soak_check_vmm_handle(struct soak_counts *c, CUmemGenericAllocationHandle h, uint64_t pid,
                          uint64_t serial)
{
    uint64_t p = 0, s = 0;
    int found = fakevmm_handle_allocation(h, &p, &s);
    return check_pair(c, found, p, s, pid, serial, "an imported handle", (CUdeviceptr)h);
}
