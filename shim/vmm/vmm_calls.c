/*
 * vmm_calls.c - how a VMM import and rebuild become cache hits (PyTorch's
 * expandable segments share memory this way).
 *
 * The consumer's rebuild is: per chunk, receive an fd and import it; reserve
 * the segment's size; map each chunk; set access on the range. Its release:
 * per chunk unmap and release; free the range. With the cache:
 *   - an import of an export we hold (same open file description, kcmp) hands
 *     back the cached allocation handle, with a reference;
 *   - a release drops the reference; the real release waits (idle);
 *   - an unmap of whole mappings of our imports keeps them mapped;
 *   - a free of a range holding only kept mappings keeps the range (idle);
 *   - a reserve of that size hands an idle range back: right after
 *     importing the allocations kept there, or (PyTorch reserves before it
 *     imports) the one holding what followed the thread's last two rebuilds
 *     last time (vmm_predict.c); each map of the same allocation at the same place is then a
 *     no-op, and a set-access that would change nothing is skipped.
 * Everything else goes to the driver, after any kept mapping in the way has
 * really been unmapped, so the driver answers what it would without us
 * (tests/gpu/vmm_errors.cu measured those answers).
 *
 * Only an import starts the cache: a process that uses the VMM calls for
 * its own memory and never imports pays one atomic load per call. No lock is
 * held across a driver call; none of these calls needs a current context.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "vmm_impl.h"
#include "budget.h"

#define RECENT_MAX 512 /* imports remembered per thread until its next reserve */

typedef CUresult (*import_fn)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*range_fn)(CUdeviceptr, size_t);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
typedef CUresult (*set_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*get_access_fn)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);

/* This thread's rebuilds. handles: what it imported since its last reserve
 * (the chunks a rebuild's reserve may find kept together, or, when it
 * reserves first, the previous rebuild's). res_addr/res_size: its latest
 * reservation, until it is freed; the first map of an import into it tells
 * whether the thread imported before or after reserving (reserve_first), and
 * each one adds to key, what the rebuild mapped (vmm_predict.c), learnt at
 * the next reserve as what followed the earlier rebuilds (history). */
static __thread struct {
    uint64_t handles[RECENT_MAX];
    size_t n;
    int overflow;
    uint64_t res_addr, res_size;
    int reserve_first;
    uint64_t key;
    struct ipcc_vmm_history history;
} recent;

/* ---- the table, fork ------------------------------------------------------ */

/* The table (budget_tables.c), once an import started it and caching is
 * on; else NULL. */
static struct ipcc_vmm_table *active(void)
{
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    if (!t || ipcc_config.disabled)
        return NULL;
    return t;
}

/* Fork child (lifecycle.c; budget_tables.c forgets the table): the thread that
 * forked forgets what it imported in the parent. No CUDA. */
void ipcc_vmm_fork_child(void)
{
    memset(&recent, 0, sizeof(recent));
    ipcc_vmm_close_fork_child();
}

static int out_of_memory(CUresult rc)
{
    return rc == CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult counted(CUresult rc)
{
    if (rc != CUDA_SUCCESS)
        IPCC_COUNT(errors);
    return rc;
}

/* ---- import, release ------------------------------------------------------- */

static void remember_recent(uint64_t handle)
{
    if (recent.n < RECENT_MAX)
        recent.handles[recent.n++] = handle;
    else
        recent.overflow = 1;
}

static CUresult real_import(import_fn real, CUmemGenericAllocationHandle *h, void *os,
                            CUmemAllocationHandleType type)
{
    CUresult rc = real(h, os, type);
    if (out_of_memory(rc)) {
        ipcc_budget_give_way_all();
        rc = real(h, os, type);
    }
    return rc;
}

/* A real import to record: keeps a dup of the fd as the identity, within
 * the bound on kept fds (vmm_fds.c); past it the import stays uncached. */
static void record_import(struct ipcc_vmm_table *t, struct ipcc_vmm_id *id,
                          CUmemGenericAllocationHandle *h)
{
    if (!id->fabric && (id->fd = ipcc_vmm_fd_keep(t, id->fd)) < 0)
        return; /* the app's handle is the driver's, as without the cache */
    uint64_t cached = 0;
    ipcc_lock();
    int r = ipcc_vmm_import_insert(t, id, *h, ipcc_clock_ns(), &cached);
    ipcc_unlock();
    if (r == 1) {
        remember_recent(*h);
        ipcc_vmm_note_import(t, *h, id->fd); /* vmm_importer.c */
        return;
    }
    if (!id->fabric)
        ipcc_vmm_fd_give_back(t, id->fd);
    if (r == 0) { /* another thread's import of the same export won */
        ((release_fn)ipcc_real(IPCC_SLOT_VMM_RELEASE))(*h);
        *h = cached;
        remember_recent(cached);
    }
}

int ipcc_vmm_import_call(uint64_t *handle, void *os, int type_int)
{
    CUmemGenericAllocationHandle *h = (CUmemGenericAllocationHandle *)handle;
    CUmemAllocationHandleType type = (CUmemAllocationHandleType)type_int;
    import_fn real = (import_fn)ipcc_real(IPCC_SLOT_VMM_IMPORT);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    ipcc_lifecycle_start();
    if (!ipcc_config.disabled && ipcc_config.vmm) /* IPCCACHE_VMM=0: no table, no caching */
        ipcc_budget_vmm_start(ipcc_vmm_kept_order, ipcc_vmm_kept_same);
    struct ipcc_vmm_table *t = active();
    struct ipcc_vmm_id id;
    if (!t || !h || ipcc_vmm_id_of(&id, os, type) < 0 || !ipcc_vmm_identity_works(&id))
        return counted(real(h, os, type));

    IPCC_COUNT(vmm_imports);
    uint64_t cached;
    ipcc_lock();
    int hit = ipcc_vmm_import_find(t, &id, ipcc_clock_ns(), &cached);
    ipcc_unlock();
    if (hit == 1) {
        IPCC_COUNT(vmm_import_hits);
        *h = cached;
        remember_recent(cached);
        return CUDA_SUCCESS;
    }
    CUresult rc = real_import(real, h, os, type);
    if (rc == CUDA_SUCCESS && hit == 0)
        record_import(t, &id, h);
    return counted(rc);
}

int ipcc_vmm_release_call(uint64_t handle)
{
    release_fn real = (release_fn)ipcc_real(IPCC_SLOT_VMM_RELEASE);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    ipcc_vmm_exporter_release(handle); /* vmm_exporter.c: importers let go first */
    struct ipcc_vmm_table *t = active();
    if (!t)
        return counted(real(handle));
    ipcc_lock();
    enum ipcc_release_result r = ipcc_vmm_release(t, handle, ipcc_clock_ns());
    ipcc_unlock();
    if (r == IPCC_RELEASE_NOT_FOUND)
        return counted(real(handle));
    if (r == IPCC_RELEASE_PAST_ZERO)
        return counted(CUDA_ERROR_INVALID_VALUE); /* the driver's answer to a double release */
    ipcc_budget_evict_over_caps();
    ipcc_vmm_after_release();
    return CUDA_SUCCESS;
}

/* ---- reserve, free, map, unmap ------------------------------------------------ */

static void note_reserve(uint64_t addr, uint64_t size)
{
    recent.res_addr = addr;
    recent.res_size = size;
}

static int imported_since_reserve(uint64_t handle)
{
    for (size_t i = 0; i < recent.n; i++)
        if (recent.handles[i] == handle)
            return 1;
    return 0;
}

/* A map of handle at ptr succeeded (or was a hit); lock held. An import
 * mapped into this thread's latest reservation is part of its rebuild (the
 * range tracked from now on); the first says which order the thread
 * rebuilds in. */
static void note_map(struct ipcc_vmm_table *t, uint64_t ptr, uint64_t handle)
{
    if (!recent.res_size || ptr < recent.res_addr || ptr - recent.res_addr >= recent.res_size)
        return;
    if (!ipcc_vmm_reserve_mapped(t, recent.res_addr, recent.res_size, ptr, handle))
        return; /* not an import: the app's own memory */
    if (!recent.key)
        recent.reserve_first = imported_since_reserve(handle);
    recent.key = ipcc_vmm_rebuild_key(recent.key, ptr - recent.res_addr, handle);
}

int ipcc_vmm_reserve_call(uint64_t *ptr, size_t size, size_t align, uint64_t addr,
                          unsigned long long flags)
{
    reserve_fn real = (reserve_fn)ipcc_real(IPCC_SLOT_VMM_RESERVE);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    struct ipcc_vmm_table *t = active();
    if (!t)
        return counted(real((CUdeviceptr *)ptr, size, align, addr, flags));
    size_t n = recent.overflow ? 0 : recent.n;
    uint64_t ended = recent.key; /* the previous rebuild, complete */
    recent.n = 0;
    recent.overflow = 0;
    recent.key = 0;
    recent.res_size = 0;
    struct ipcc_vmm_ops ops = { 0 };
    int reused = 0;
    ipcc_lock();
    ipcc_vmm_rebuild_done(t, &recent.history, ended);
    if (addr)
        ipcc_vmm_clear_range(t, addr, size, &ops); /* the hint may be ours: give way */
    else if (ptr && flags == 0 && n > 0 && (align & (align - 1)) == 0) /* else the driver's error */
        reused = recent.reserve_first
                     ? ipcc_vmm_reserve_next(t, size, align, &recent.history, ipcc_clock_ns(), ptr)
                     : ipcc_vmm_reserve_reuse(t, size, align, recent.handles, n, ipcc_clock_ns(),
                                              ptr);
    ipcc_unlock();
    ipcc_vmm_close_run(&ops, 1);
    if (reused) {
        note_reserve(*ptr, size);
        return CUDA_SUCCESS;
    }
    if (addr) /* a kept range there that another thread is freeing: the hint is free after it */
        ipcc_vmm_close_wait(addr, size);
    CUresult rc = real((CUdeviceptr *)ptr, size, align, addr, flags);
    if (out_of_memory(rc)) {
        ipcc_budget_give_way_all();
        rc = real((CUdeviceptr *)ptr, size, align, addr, flags);
    }
    if (rc == CUDA_SUCCESS && n > 0) { /* a rebuild: imports came first (or the last one's) */
        ipcc_lock();
        ipcc_vmm_reserve_track(t, *ptr, size);
        ipcc_unlock();
    }
    if (rc == CUDA_SUCCESS)
        note_reserve(*ptr, size);
    return counted(rc);
}

/* Asks the table about a call on a range; answers it or runs what the table
 * needs done first. Returns 1 with *rc set when answered. */
static int answered(enum ipcc_vmm_verdict v, struct ipcc_vmm_ops *ops, CUresult *rc)
{
    ipcc_vmm_close_run(ops, 1);
    if (v == IPCC_VMM_PASS)
        return 0;
    *rc = v == IPCC_VMM_DONE ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    return 1;
}

typedef enum ipcc_vmm_verdict (*range_ask_fn)(struct ipcc_vmm_table *, uint64_t, uint64_t,
                                              uint64_t, struct ipcc_vmm_ops *);
typedef void (*range_done_fn)(struct ipcc_vmm_table *, uint64_t, uint64_t);

/* Unmap and address free: ask the table, else call the driver and tell the
 * table what the driver did (done, if any). Something the table kept may
 * have gone idle. */
static int range_call(int slot, uint64_t ptr, size_t size, range_ask_fn ask, range_done_fn done)
{
    range_fn real = (range_fn)ipcc_real(slot);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    struct ipcc_vmm_table *t = active();
    if (!t)
        return counted(real(ptr, size));
    struct ipcc_vmm_ops ops = { 0 };
    CUresult rc;
    ipcc_lock();
    enum ipcc_vmm_verdict v = ask(t, ptr, size, ipcc_clock_ns(), &ops);
    ipcc_unlock();
    if (answered(v, &ops, &rc)) {
        if (v == IPCC_VMM_DONE) {
            ipcc_budget_evict_over_caps();
            ipcc_vmm_after_release();
        }
        return counted(rc);
    }
    ipcc_vmm_close_wait(ptr, size); /* one we took may still be mapped or reserved there */
    rc = real(ptr, size);
    if (rc == CUDA_SUCCESS && done) {
        ipcc_lock();
        done(t, ptr, size);
        ipcc_unlock();
    }
    return counted(rc);
}

int ipcc_vmm_free_call(uint64_t ptr, size_t size)
{
    if (ptr == recent.res_addr)
        recent.res_size = 0; /* gone: never tracked after the fact */
    return range_call(IPCC_SLOT_VMM_FREE, ptr, size, ipcc_vmm_free, NULL); /* forgot it before */
}

int ipcc_vmm_unmap_call(uint64_t ptr, size_t size)
{
    return range_call(IPCC_SLOT_VMM_UNMAP, ptr, size, ipcc_vmm_unmap, ipcc_vmm_unmap_done);
}

int ipcc_vmm_map_call(uint64_t ptr, size_t size, size_t offset, uint64_t handle,
                      unsigned long long flags)
{
    map_fn real = (map_fn)ipcc_real(IPCC_SLOT_VMM_MAP);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    struct ipcc_vmm_table *t = active();
    if (!t)
        return counted(real(ptr, size, offset, handle, flags));
    IPCC_COUNT(vmm_maps);
    struct ipcc_vmm_ops ops = { 0 };
    CUresult rc;
    ipcc_lock();
    /* A handle the app released: the driver's answer to one it took back,
     * though we still hold the import (idle, or kept mapped elsewhere). */
    enum ipcc_vmm_verdict v = ipcc_vmm_import_released(t, handle) ? IPCC_VMM_INVALID
                              : offset || flags
                                  ? ipcc_vmm_give_way(t, ptr, size, &ops)
                                  : ipcc_vmm_map(t, ptr, size, handle, ipcc_clock_ns(), &ops);
    if (v == IPCC_VMM_DONE)
        note_map(t, ptr, handle);
    ipcc_unlock();
    if (answered(v, &ops, &rc)) {
        if (v == IPCC_VMM_DONE)
            IPCC_COUNT(vmm_map_hits);
        return counted(rc);
    }
    ipcc_vmm_close_wait(ptr, size);
    rc = real(ptr, size, offset, handle, flags);
    if (out_of_memory(rc)) {
        ipcc_budget_give_way_all();
        rc = real(ptr, size, offset, handle, flags);
    }
    if (rc == CUDA_SUCCESS) {
        ipcc_lock();
        note_map(t, ptr, handle);
        ipcc_vmm_map_done(t, ptr, size, handle);
        ipcc_unlock();
    }
    return counted(rc);
}

/* ---- access ------------------------------------------------------------------------ */

/* Device descriptors only, at most 16; else -1 (the driver decides). */
static int access_list(const CUmemAccessDesc *desc, size_t count, struct ipcc_vmm_access *out)
{
    if (!desc || count == 0 || count > 16)
        return -1;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return -1;
        out[i] = (struct ipcc_vmm_access){ desc[i].location.id, desc[i].flags };
    }
    return (int)count;
}

int ipcc_vmm_set_access_call(uint64_t ptr, size_t size, const void *desc_v, size_t count)
{
    const CUmemAccessDesc *desc = desc_v;
    set_access_fn real = (set_access_fn)ipcc_real(IPCC_SLOT_VMM_SET_ACCESS);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    struct ipcc_vmm_table *t = active();
    if (!t)
        return counted(real(ptr, size, desc, count));
    struct ipcc_vmm_access acc[16];
    int n = access_list(desc, count, acc);
    struct ipcc_vmm_ops ops = { 0 };
    CUresult rc;
    ipcc_lock();
    enum ipcc_vmm_verdict v = n < 0 ? ipcc_vmm_give_way(t, ptr, size, &ops)
                                    : ipcc_vmm_set_access(t, ptr, size, acc, (size_t)n, &ops);
    ipcc_unlock();
    if (answered(v, &ops, &rc)) {
        if (v == IPCC_VMM_DONE)
            IPCC_COUNT(vmm_access_skips);
        return counted(rc);
    }
    rc = real(ptr, size, desc, count);
    if (rc == CUDA_SUCCESS) {
        ipcc_lock();
        ipcc_vmm_set_access_done(t, ptr, size, n > 0 ? acc : NULL, n > 0 ? (size_t)n : 0);
        ipcc_unlock();
    }
    return counted(rc);
}

int ipcc_vmm_get_access_call(unsigned long long *flags, const void *location, uint64_t ptr)
{
    get_access_fn real = (get_access_fn)ipcc_real(IPCC_SLOT_VMM_GET_ACCESS);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    struct ipcc_vmm_table *t = active();
    if (!t || !flags || !location)
        return counted(real(flags, location, ptr));
    struct ipcc_vmm_ops ops = { 0 };
    CUresult rc;
    ipcc_lock();
    enum ipcc_vmm_verdict v = ipcc_vmm_give_way(t, ptr, 1, &ops);
    ipcc_unlock();
    if (answered(v, &ops, &rc)) {
        *flags = 0; /* as the driver leaves it on this error */
        return counted(rc);
    }
    rc = real(flags, location, ptr); /* the driver checks the arguments */
    const CUmemLocation *loc = location;
    if (rc == CUDA_SUCCESS && loc->type == CU_MEM_LOCATION_TYPE_DEVICE) {
        /* A kept chunk mapped again has its old access; the app's has none. */
        ipcc_lock();
        ipcc_vmm_access_seen(t, ptr, loc->id, flags);
        ipcc_unlock();
    }
    return counted(rc);
}
