/*
 * vmm_evict.c - really releasing what the VMM table gave up: the orders a
 * decision queued, idle entries past the caps (least recently used first),
 * everything idle when the driver runs out of memory, and at exit.
 *
 * Never under the lock: the table hands out its orders, the lock is dropped,
 * then the driver is called. None of these calls needs a current context
 * (measured), so no context is switched.
 */
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

#include "internal.h"

typedef CUresult (*range_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

#define NO_DRIVER CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND

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

/* Evicts least recently used idle entries while over the caps, or (all)
 * every idle one: at exit (nothing needs a context, measured; not counted as
 * evictions) and when the driver is out of memory, since what we keep must
 * give way. */
static void evict(int all, int counted_as_evictions)
{
    struct ipcc_vmm_table *t = ipcc_vmm_table();
    if (!t)
        return;
    for (;;) {
        struct ipcc_vmm_ops ops = { 0 };
        ipcc_lock();
        int more = (all || ipcc_vmm_over_caps(t, ipcc_config.max_idle_bytes,
                                              ipcc_config.max_idle_entries)) &&
                   ipcc_vmm_evict_one(t, &ops);
        ipcc_unlock();
        ipcc_vmm_run_ops(&ops, counted_as_evictions);
        if (!more)
            return;
    }
}

/* After a call that left something idle: two atomic loads when under. */
void ipcc_vmm_evict_over_caps(void)
{
    evict(0, 1);
}

/* The driver is out of memory or handles: everything idle gives way. */
void ipcc_vmm_give_way_all(void)
{
    evict(1, 1);
}

/* At exit (lifecycle.c), after the stats line. */
void ipcc_vmm_release_all_idle(void)
{
    evict(1, 0);
}
