/*
 * vmm_exporter.c - the exporter's side of the release ledger on the VMM
 * path (PyTorch's expandable segments).
 *
 * cuMemExportToShareableHandle to a POSIX fd: remember the allocation's
 * exports and list each in the ledger as a tag (exporter pid and start time,
 * the fd number, a serial), so an importer can find, by comparing the fd it
 * received with ours (kcmp), whose export it imported. cuMemRelease of such
 * an allocation: ask the importers to let go of their idle imports of each
 * export, wait for them (IPCCACHE_RELEASE_WAIT_MS at most, for all exports
 * together), then release for real - so the memory comes back as it does
 * without the cache.
 *
 * Releases of allocations never exported cost one atomic load until the
 * process exports something, then one hash lookup under the table lock,
 * never held across a driver call or the wait. Fabric handles are not
 * covered: no fd to compare.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "vmm_impl.h"
#include "ledger.h"

static int exports_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (exports_oom = 1)
#include <uthash.h>

typedef CUresult (*export_fn)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                              unsigned long long);

#define TAG_MAGIC "ipccVMM1"

/* The ledger's 64 bytes for one export; unused bytes zero. */
struct tag {
    char magic[8];
    int32_t pid, fd;
    uint64_t start, serial;
};
_Static_assert(sizeof(struct tag) <= IPCC_HANDLE_BYTES, "a tag fits a handle");

struct fd_export {
    int fd, listed;
    uint64_t serial;
};

/* One exported allocation and its exports. Under the table lock. */
struct exported {
    uint64_t handle;
    struct fd_export *ex;
    size_t n;
    UT_hash_handle hh;
};

static struct exported *exported;
static _Atomic int anything_exported;
static _Atomic uint64_t next_serial;

static void tag_of(unsigned char out[IPCC_HANDLE_BYTES], const struct fd_export *x)
{
    struct ipcc_proc me = ipcc_proc_self();
    struct tag t = { .pid = me.pid, .fd = x->fd, .start = me.start, .serial = x->serial };
    memcpy(t.magic, TAG_MAGIC, sizeof(t.magic));
    memset(out, 0, IPCC_HANDLE_BYTES);
    memcpy(out, &t, sizeof(t));
}

int ipcc_vmm_tag_fd(const void *tag)
{
    struct tag t;
    memcpy(&t, tag, sizeof(t));
    return memcmp(t.magic, TAG_MAGIC, sizeof(t.magic)) == 0 ? t.fd : -1;
}

static void forget(struct exported *e)
{
    HASH_DEL(exported, e);
    ipcc_mem_free(e->ex);
    ipcc_mem_free(e);
}

/* Fork child (entry/wiring.c's list): the parent's allocations are not the
 * child's to release. */
void ipcc_vmm_exporter_fork_child(void)
{
    struct exported *e, *tmp;
    HASH_ITER(hh, exported, e, tmp)
        forget(e);
    atomic_store(&anything_exported, 0);
}

/* ---- export ----------------------------------------------------------------- */

/* Lock held. The fd number of a new export was free, so any earlier export
 * listed under it was closed: its listing could only mislead importers.
 * Copies those into stale (at most cap) and marks them unlisted. */
static size_t unlist_fd(int fd, struct fd_export *stale, size_t cap)
{
    struct exported *e, *tmp;
    size_t n = 0;
    HASH_ITER(hh, exported, e, tmp) {
        for (size_t i = 0; i < e->n; i++) {
            if (!e->ex[i].listed || e->ex[i].fd != fd || n == cap)
                continue;
            e->ex[i].listed = 0;
            stale[n++] = e->ex[i];
        }
    }
    return n;
}

/* Lock held: adds export x of handle; 0, or -1 out of memory. */
static int add(uint64_t handle, struct fd_export x)
{
    struct exported *e;
    HASH_FIND(hh, exported, &handle, sizeof(handle), e);
    if (!e && (e = ipcc_mem_calloc(1, sizeof(*e))) != NULL) {
        e->handle = handle;
        exports_oom = 0;
        HASH_ADD(hh, exported, handle, sizeof(e->handle), e);
        if (exports_oom) {
            ipcc_mem_free(e);
            e = NULL;
        }
    }
    struct fd_export *grown = e ? ipcc_mem_realloc(e->ex, (e->n + 1) * sizeof(*e->ex)) : NULL;
    if (!grown) {
        if (e && e->n == 0)
            forget(e);
        return -1;
    }
    e->ex = grown;
    e->ex[e->n++] = x;
    return 0;
}

static void remember(uint64_t handle, int fd)
{
    struct fd_export x = { fd, 1, atomic_fetch_add(&next_serial, 1) + 1 }, stale[4];
    unsigned char tag[IPCC_HANDLE_BYTES];
    ipcc_lock();
    size_t nstale = unlist_fd(fd, stale, 4);
    int rc = add(handle, x);
    ipcc_unlock();
    for (size_t i = 0; i < nstale; i++) {
        tag_of(tag, &stale[i]);
        ipcc_ledger_unpublish(tag);
    }
    if (rc < 0) {
        ipcc_log(IPCC_LOG_WARN, "out of memory; releasing an exported VMM allocation will "
                                "not wait for importers");
        return;
    }
    atomic_store_explicit(&anything_exported, 1, memory_order_release);
    tag_of(tag, &x);
    ipcc_ledger_publish_tag(tag); /* not listed: importers cannot tell it is ours */
}

int ipcc_vmm_export_call(void *out, uint64_t handle, int type, unsigned long long flags)
{
    export_fn real = (export_fn)ipcc_real(IPCC_SLOT_VMM_EXPORT);
    if (!real)
        return IPCC_CUDA_NO_DRIVER;
    CUresult rc = real(out, handle, (CUmemAllocationHandleType)type, flags);
    if (rc != CUDA_SUCCESS || !out || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return rc;
    ipcc_lifecycle_start();
    if (ipcc_config.disabled || !ipcc_config.vmm)
        return rc;
    remember(handle, *(int *)out);
    return rc;
}

/* ---- release ---------------------------------------------------------------- */

/* Takes handle's exports off the table; NULL if it was never exported. */
static struct exported *take(uint64_t handle)
{
    struct exported *e;
    ipcc_lock();
    HASH_FIND(hh, exported, &handle, sizeof(handle), e);
    if (e)
        HASH_DEL(exported, e);
    ipcc_unlock();
    return e;
}

/* Before the real cuMemRelease of handle: if it was exported, importers let
 * go of their idle imports of it first. */
void ipcc_vmm_exporter_release(uint64_t handle)
{
    if (!atomic_load_explicit(&anything_exported, memory_order_acquire))
        return;
    struct exported *e = take(handle);
    if (!e)
        return;
    uint64_t deadline = ipcc_clock_ns() + ipcc_config.release_wait_ms * 1000000ULL;
    unsigned char tag[IPCC_HANDLE_BYTES];
    for (size_t i = 0; i < e->n; i++) {
        uint64_t now = ipcc_clock_ns();
        tag_of(tag, &e->ex[i]);
        int late = ipcc_ledger_release(tag, deadline > now ? deadline - now : 0);
        if (late > 0)
            ipcc_log(IPCC_LOG_DEBUG, "%d importer(s) did not let go of a VMM export within "
                     "%llu ms", late, (unsigned long long)ipcc_config.release_wait_ms);
        if (e->ex[i].listed)
            ipcc_ledger_unpublish(tag);
    }
    ipcc_mem_free(e->ex);
    ipcc_mem_free(e);
}
