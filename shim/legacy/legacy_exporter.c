/*
 * legacy_exporter.c - the exporter's side of the release ledger.
 *
 * cuIpcGetMemHandle: remember the exported allocation (its base address and
 * handles) and publish each handle in the ledger, so importers learn whose it
 * is. cuMemFree of such an allocation: ask the importers to close their idle
 * mappings of it under each handle, wait for them (IPCCACHE_RELEASE_WAIT_MS
 * at most, for all together), then free for real - so the memory comes back
 * as it does without the cache.
 *
 * The H200's driver gives one allocation the same 64 bytes at every export
 * (of its base or a pointer inside it); a driver may give each call a handle
 * of its own. Up to HANDLES_PER_ALLOCATION distinct ones are remembered and
 * listed: the first and the most recent. The one a new handle pushes out is
 * asked about at once and unlisted, so that every handle is asked about and
 * a process that re-exports without end lists a bounded number of them.
 *
 * Each export remembers the context it was made in, whose teardown frees the
 * allocation too (legacy_exporter_teardown.c).
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

#include "legacy_impl.h"
#include "ledger.h"

static int exported_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (exported_oom = 1)
#include <uthash.h>

typedef CUresult (*get_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*free_v1_fn)(unsigned int);
typedef CUresult (*free_v2_fn)(CUdeviceptr);


#define HANDLES_PER_ALLOCATION 8

/* An exported allocation: handle[0] its first handle, the others a ring of
 * the most recent (next: the oldest of them, replaced next once full). */
struct exported {
    uint64_t base;
    unsigned n, next;
    unsigned char handle[HANDLES_PER_ALLOCATION][IPCC_HANDLE_BYTES];
    void *ctx;          /* the context current at the last export, NULL if none */
    uint64_t ctx_id;    /* and its id: a pointer alone may be a newer context */
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

/* Lock held: adds handle to e's unless it is there; 1 when it is new. A
 * handle pushed out to make room is copied to dropped (*was_dropped set). */
static int add_handle(struct exported *e, const void *handle,
                      unsigned char dropped[IPCC_HANDLE_BYTES], int *was_dropped)
{
    for (unsigned i = 0; i < e->n; i++)
        if (memcmp(e->handle[i], handle, IPCC_HANDLE_BYTES) == 0)
            return 0;
    unsigned at = e->n;
    if (at == HANDLES_PER_ALLOCATION) {
        at = 1 + e->next;
        e->next = (e->next + 1) % (HANDLES_PER_ALLOCATION - 1);
        memcpy(dropped, e->handle[at], IPCC_HANDLE_BYTES);
        *was_dropped = 1;
    } else {
        e->n++;
    }
    memcpy(e->handle[at], handle, IPCC_HANDLE_BYTES);
    return 1;
}

/* A handle no longer remembered: importers let go of it now, as at a free,
 * and it leaves the ledger. */
static void let_go_early(const unsigned char *handle)
{
    static _Atomic int said;
    if (!atomic_exchange_explicit(&said, 1, memory_order_relaxed))
        ipcc_log(IPCC_LOG_INFO, "an allocation was exported with more than %d different "
                                "handles: importers let go of the older ones' idle mappings "
                                "at once", HANDLES_PER_ALLOCATION);
    ipcc_ledger_release(handle, ipcc_config.release_wait_ms * 1000000ULL);
    ipcc_ledger_unpublish(handle);
}

/* The calling thread's current context and its id; NULL without one (or
 * without context ids: such an export is let go of only at its free). */
static void *export_context(uint64_t *id)
{
    const struct ipcc_driver *d = ipcc_driver();
    void *ctx = NULL;
    if (!d->ctx_get_current || d->ctx_get_current(&ctx) != CUDA_SUCCESS ||
        ipcc_legacy_context_id(NULL, id) < 0)
        return NULL;
    return ctx;
}

static void remember(uint64_t base, const void *handle, void *ctx, uint64_t ctx_id)
{
    struct exported *e;
    unsigned char dropped[IPCC_HANDLE_BYTES];
    int is_new = 0, was_dropped = 0;
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
    if (e) {
        is_new = add_handle(e, handle, dropped, &was_dropped);
        e->ctx = ctx;
        e->ctx_id = ctx_id;
    }
    ipcc_unlock();
    if (!e) {
        ipcc_log(IPCC_LOG_WARN, "out of memory; freeing exported 0x%llx will not wait "
                                "for importers", (unsigned long long)base);
        return;
    }
    atomic_store_explicit(&anything_exported, 1, memory_order_release);
    if (was_dropped)
        let_go_early(dropped);
    if (is_new)
        ipcc_ledger_publish(handle); /* unknown to the ledger: importers ask for all */
}

/* Takes the allocation at base off the exported set; NULL if it was not
 * exported. The caller frees it. */
static struct exported *forget(uint64_t base)
{
    struct exported *e;
    ipcc_lock();
    HASH_FIND(hh, exported, &base, sizeof(base), e);
    if (e)
        HASH_DEL(exported, e);
    ipcc_unlock();
    return e;
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
    uint64_t ctx_id = 0;
    void *ctx = export_context(&ctx_id);
    remember(base_of(dptr), handle, ctx, ctx_id);
    return rc;
}

int ipcc_legacy_exported_any(void)
{
    return atomic_load_explicit(&anything_exported, memory_order_acquire);
}

/* Asks importers to let go of e's every handle, waiting for them all
 * together (wait_ns at most), and unlists them. */
static void release_exported(const struct exported *e, uint64_t wait_ns)
{
    uint64_t deadline = ipcc_clock_ns() + wait_ns;
    for (unsigned i = 0; i < e->n; i++) {
        uint64_t now = ipcc_clock_ns();
        int late = ipcc_ledger_release(e->handle[i], deadline > now ? deadline - now : 0);
        if (late > 0)
            ipcc_log(IPCC_LOG_DEBUG, "%d importer(s) did not let go of 0x%llx within %llu ms",
                     late, (unsigned long long)e->base,
                     (unsigned long long)ipcc_config.release_wait_ms);
        ipcc_ledger_unpublish(e->handle[i]);
    }
}

/* Before the allocation at base goes (its free, its context's teardown): if
 * it was exported, importers let go of their idle mappings of it (waiting
 * wait_ns at most) and its handles leave the ledger. */
void ipcc_legacy_unexport(uint64_t base, uint64_t wait_ns)
{
    struct exported *e = ipcc_legacy_exported_any() ? forget(base) : NULL;
    if (e) {
        release_exported(e, wait_ns);
        ipcc_mem_free(e);
    }
}

/* Up to cap bases of the allocations exported in context ctx_id; how many. */
size_t ipcc_legacy_exported_in(uint64_t ctx_id, uint64_t *bases, size_t cap)
{
    struct exported *e, *tmp;
    size_t n = 0;
    ipcc_lock();
    HASH_ITER(hh, exported, e, tmp) {
        if (n == cap)
            break;
        if (e->ctx && e->ctx_id == ctx_id)
            bases[n++] = e->base;
    }
    ipcc_unlock();
    return n;
}

/* The contexts exports were made in, each once, up to cap; how many. */
size_t ipcc_legacy_export_contexts(void **ctxs, uint64_t *ids, size_t cap)
{
    struct exported *e, *tmp;
    size_t n = 0;
    ipcc_lock();
    HASH_ITER(hh, exported, e, tmp) {
        size_t i = 0;
        while (i < n && ids[i] != e->ctx_id)
            i++;
        if (!e->ctx || i < n)
            continue;
        if (n == cap)
            break;
        ctxs[n] = e->ctx;
        ids[n++] = e->ctx_id;
    }
    ipcc_unlock();
    return n;
}

/* Asks importers to let go of the allocation at dptr if it was exported,
 * then frees it for real (the ABI of the given slot). */
int ipcc_legacy_free_call(int slot, uint64_t dptr)
{
    void *real = ipcc_real(slot);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    ipcc_legacy_unexport(dptr, ipcc_config.release_wait_ms * 1000000ULL);
    if (slot == IPCC_SLOT_MEM_FREE_V1)
        return ((free_v1_fn)real)((unsigned int)dptr);
    return ((free_v2_fn)real)((CUdeviceptr)dptr);
}
