/*
 * legacy_exporter.c - the exporter's side of the release ledger.
 *
 * cuIpcGetMemHandle: remember the exported allocation (its base address and
 * handle) and publish the handle in the ledger, so importers learn whose it
 * is. cuMemFree of such an allocation: ask the importers to close their idle
 * mappings of it, wait for them (IPCCACHE_RELEASE_WAIT_MS at most), then free
 * for real - so the memory comes back as it does without the cache.
 *
 * Frees of memory never exported cost one atomic load until the process
 * exports something, then one hash lookup under the table lock. The table
 * lock is never held across a driver call or the wait.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "legacy.h"
#include "ledger.h"

static int exported_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (exported_oom = 1)
#include <uthash.h>

typedef CUresult (*get_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*free_v1_fn)(unsigned int);
typedef CUresult (*free_v2_fn)(CUdeviceptr);


struct exported {
    uint64_t base;
    unsigned char handle[IPCC_HANDLE_BYTES];
    UT_hash_handle hh;
};

static struct exported *exported;   /* under the table lock */
static _Atomic int anything_exported;

/* Fork child (entry/wiring.c's list): the parent's allocations are not the
 * child's to free. */
void ipcc_legacy_exporter_fork_child(void)
{
    struct exported *e, *tmp;
    HASH_ITER(hh, exported, e, tmp) {
        HASH_DEL(exported, e);
        ipcc_mem_free(e);
    }
    atomic_store(&anything_exported, 0);
}

/* The allocation's base: the driver hands out one handle per allocation,
 * whatever pointer inside it was exported, and frees by base. */
static uint64_t base_of(uint64_t dptr)
{
    const struct ipcc_driver *d = ipcc_driver();
    uint64_t base = 0;
    if (d->mem_get_range && d->mem_get_range(&base, NULL, dptr) == CUDA_SUCCESS && base)
        return base;
    return dptr;
}

static void remember(uint64_t base, const void *handle)
{
    struct exported *e;
    ipcc_lock();
    HASH_FIND(hh, exported, &base, sizeof(base), e);
    if (!e && (e = ipcc_mem_calloc(1, sizeof(*e))) != NULL) {
        e->base = base;
        exported_oom = 0;
        HASH_ADD(hh, exported, base, sizeof(e->base), e);
        if (exported_oom) {
            ipcc_mem_free(e);
            e = NULL;
        }
    }
    if (e)
        memcpy(e->handle, handle, IPCC_HANDLE_BYTES);
    ipcc_unlock();
    if (!e) {
        ipcc_log(IPCC_LOG_WARN, "out of memory; freeing exported 0x%llx will not wait "
                                "for importers", (unsigned long long)base);
        return;
    }
    atomic_store_explicit(&anything_exported, 1, memory_order_release);
}

/* Takes the allocation at base off the exported set; 1 with its handle. */
static int forget(uint64_t base, unsigned char handle[IPCC_HANDLE_BYTES])
{
    struct exported *e;
    ipcc_lock();
    HASH_FIND(hh, exported, &base, sizeof(base), e);
    if (e) {
        memcpy(handle, e->handle, IPCC_HANDLE_BYTES);
        HASH_DEL(exported, e);
    }
    ipcc_unlock();
    ipcc_mem_free(e);
    return e != NULL;
}

int ipcc_legacy_export_call(void *handle, uint64_t dptr)
{
    get_fn real = (get_fn)ipcc_real(IPCC_SLOT_IPC_GET);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    CUresult rc = real((CUipcMemHandle *)handle, (CUdeviceptr)dptr);
    if (rc != CUDA_SUCCESS || !handle)
        return rc;
    ipcc_lifecycle_start();
    if (ipcc_config.disabled)
        return rc;
    remember(base_of(dptr), handle);
    ipcc_ledger_publish(handle); /* unknown to the ledger: importers ask for all */
    return rc;
}

/* Asks importers to let go of the allocation at dptr if it was exported,
 * then frees it for real (the ABI of the given slot). */
int ipcc_legacy_free_call(int slot, uint64_t dptr)
{
    void *real = ipcc_real(slot);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    unsigned char handle[IPCC_HANDLE_BYTES];
    if (atomic_load_explicit(&anything_exported, memory_order_acquire) && forget(dptr, handle)) {
        int late = ipcc_ledger_release(handle, ipcc_config.release_wait_ms * 1000000ULL);
        if (late > 0)
            ipcc_log(IPCC_LOG_DEBUG, "%d importer(s) did not let go of 0x%llx within %llu ms",
                     late, (unsigned long long)dptr,
                     (unsigned long long)ipcc_config.release_wait_ms);
        ipcc_ledger_unpublish(handle);
    }
    if (slot == IPCC_SLOT_MEM_FREE_V1)
        return ((free_v1_fn)real)((unsigned int)dptr);
    return ((free_v2_fn)real)((CUdeviceptr)dptr);
}
