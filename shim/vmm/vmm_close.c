/*
 * vmm_close.c - really releasing what the VMM table gave up: the orders a
 * decision queued (a kept mapping in the app's way) or an eviction took
 * (idle_budget.c: the one budget, out of memory, exit).
 *
 * Never under the lock: the table hands out its orders, the lock is dropped,
 * then the driver is called. None of these calls needs a current context
 * (measured), so no context is switched.
 */
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

#include "vmm.h"
#include "budget.h"

typedef CUresult (*range_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

#define NO_DRIVER CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND

/* The app's calls with this handle value are the driver's again. */
static void release_done(uint64_t handle)
{
    ipcc_lock();
    struct ipcc_vmm_table *t = ipcc_vmm_table();
    if (t)
        ipcc_vmm_release_done(t, handle);
    ipcc_unlock();
}

/* Runs the table's orders, in order, and frees them. */
void ipcc_vmm_run_ops(struct ipcc_vmm_ops *ops, int evicted)
{
    for (size_t i = 0; i < ops->n; i++) {
        const struct ipcc_vmm_victim *v = &ops->v[i];
        CUresult rc = CUDA_SUCCESS;
        if (v->op == IPCC_VMM_UNMAP) {
            range_fn f = (range_fn)ipcc_real(IPCC_SLOT_VMM_UNMAP);
            rc = f ? f(v->addr, v->size) : NO_DRIVER;
        } else if (v->op == IPCC_VMM_FREE) {
            range_fn f = (range_fn)ipcc_real(IPCC_SLOT_VMM_FREE);
            rc = f ? f(v->addr, v->size) : NO_DRIVER;
        } else {
            release_fn f = (release_fn)ipcc_real(IPCC_SLOT_VMM_RELEASE);
            rc = f ? f(v->handle) : NO_DRIVER;
            release_done(v->handle);
            if (v->fd >= 0)
                close(v->fd);
            if (rc == CUDA_SUCCESS && evicted)
                IPCC_COUNT(evictions);
        }
        if (rc != CUDA_SUCCESS)
            ipcc_log(IPCC_LOG_DEBUG, "releasing a kept VMM resource failed: error %d", (int)rc);
    }
    if (ops->lost)
        ipcc_log(IPCC_LOG_WARN, "out of memory; %zu kept VMM resources stay until exit",
                 ops->lost);
    free(ops->v);
    ops->v = NULL;
    ops->n = ops->cap = ops->lost = 0;
}
