/*
 * fuzz_vmm.c - the differential fuzzer's VMM operations (PyTorch's
 * expandable segments path), run by tests/fuzz/fuzz.c's threads.
 *
 * Each thread creates its own allocations (cuMemCreate), exports them to
 * fds, and imports them back: the same fd, a dup of it received as
 * pidfd_getfd gives it (a new number, closed after the import), a new
 * export of the same allocation (another description: another identity),
 * or a recycled fd number (dup2 puts a new export of a new allocation at
 * the old number: the old import must not come back). It reserves, maps,
 * unmaps (whole, partial, holes), sets and gets access, frees ranges, in
 * both rebuild orders (PyTorch reserves first, others import first), with
 * wrong sizes, alignments, handles and unmapped ranges, and releases past
 * zero.
 *
 * Output is facts that do not depend on handle values or addresses, which
 * the cache legitimately changes (one handle for repeated imports; kept
 * ranges move the driver's placement): return codes, access flags, and which
 * of the thread's allocations a handle names or a mapped address holds (the
 * stand-in's test hooks say; it has no host-visible memory to read data
 * through). Hence two rules where the cache's one handle per export could
 * show: a handle the app released is used again (release past zero, map)
 * only while the app holds no other import of the same description, and
 * import results are never compared with each other.
 *
 * Threads own their fds, allocations and reservations, and touch no address
 * they no longer hold (another thread, or the cache's kept ranges, may sit
 * there), so nothing printed depends on interleaving; a closed fd number is
 * imported only right after closing it, in single-threaded runs.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_vmm.h"
#include "fuzz.h"

#define G FAKEVMM_GRANULARITY
#define FD_TYPE CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
/* Aligned, below the stand-in's address space and every hint: never reserved. */
#define UNRESERVED 0x40000000ULL

static struct {
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                          unsigned long long);
    CUresult (*import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*get_access)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
    int (*handle_allocation)(CUmemGenericAllocationHandle, uint64_t *, uint64_t *);
    int (*allocation_at)(CUdeviceptr, uint64_t *, uint64_t *);
    size_t (*list)(struct fakevmm_item *, size_t);
    long long (*raw_access)(CUdeviceptr, int);
} vd;

void vmm_load(void)
{
    vd.create = lookup("cuMemCreate", 10020, 10020, NULL);
    vd.export_fd = lookup("cuMemExportToShareableHandle", 10020, 10020, NULL);
    vd.import = lookup("cuMemImportFromShareableHandle", 10020, 10020, NULL);
    vd.release = lookup("cuMemRelease", 10020, 10020, NULL);
    vd.reserve = lookup("cuMemAddressReserve", 10020, 10020, NULL);
    vd.free = lookup("cuMemAddressFree", 10020, 10020, NULL);
    vd.map = lookup("cuMemMap", 10020, 10020, NULL);
    vd.unmap = lookup("cuMemUnmap", 10020, 10020, NULL);
    vd.set_access = lookup("cuMemSetAccess", 10020, 10020, NULL);
    vd.get_access = lookup("cuMemGetAccess", 10020, 10020, NULL);
    vd.handle_allocation = driver_symbol("fakevmm_handle_allocation");
    vd.allocation_at = driver_symbol("fakevmm_allocation_at");
    vd.list = driver_symbol("fakevmm_list");
    vd.raw_access = driver_symbol("fakevmm_access");
}

static void reset(struct fuzz_vmm *v, int tid, int devnull)
{
    memset(v, 0, sizeof(*v));
    v->tid = tid, v->devnull = devnull;
    for (int e = 0; e < VMM_EXPORTS; e++)
        v->exp[e].fd = -1;
}

void vmm_start(struct fuzz_vmm *v, int tid)
{
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0)
        die("cannot open /dev/null");
    reset(v, tid, devnull);
}

void vmm_child(struct fuzz_vmm *v)
{
    reset(v, v->tid, v->devnull);
}

/* ---- names: which of this thread's allocations ------------------------- */

static int name_of_serial(const struct fuzz_vmm *v, uint64_t serial)
{
    for (int i = 0; i < v->nnames; i++)
        if (v->serials[i] == serial)
            return i;
    return -1;
}

/* The allocation a live handle names (-1: none of ours, or not live). */
static int name_of_handle(const struct fuzz_vmm *v, CUmemGenericAllocationHandle h)
{
    uint64_t pid, serial;
    return vd.handle_allocation(h, &pid, &serial) ? name_of_serial(v, serial) : -1;
}

/* What the app reads at ptr: the allocation mapped there ("none": nothing). */
static void log_reads(struct thread *t, const struct fuzz_vmm *v, CUdeviceptr p)
{
    uint64_t pid, serial;
    if (vd.allocation_at(p, &pid, &serial))
        log_line(t, " reads a%d", name_of_serial(v, serial));
    else
        log_line(t, " reads none");
}

static unsigned chunks_of_name(const struct fuzz_vmm *v, int name)
{
    return name >= 0 && name < v->nnames ? v->name_chunks[name] : 1;
}

/* ---- allocations, exports ------------------------------------------------ */

static CUmemAllocationProp fd_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = FD_TYPE;
    return prop;
}

/* Creates an allocation of chunks granules in slot s; returns its name. */
static int create_in(struct thread *t, struct fuzz_vmm *v, int s, unsigned chunks)
{
    CUmemAllocationProp prop = fd_prop();
    CUmemGenericAllocationHandle h = 0;
    CUresult rc = v->nnames < VMM_NAMES ? vd.create(&h, chunks * G, &prop, 0) : CUDA_ERROR_UNKNOWN;
    uint64_t pid, serial = 0;
    if (rc != CUDA_SUCCESS || !vd.handle_allocation(h, &pid, &serial)) {
        log_line(t, "vmm-create s%d -> %d\n", s, (int)rc);
        return -1;
    }
    v->serials[v->nnames] = serial;
    v->name_chunks[v->nnames] = chunks;
    v->alloc[s].h = h, v->alloc[s].live = 1, v->alloc[s].chunks = chunks;
    v->alloc[s].name = v->nnames++;
    log_line(t, "vmm-create s%d %u chunk(s) -> 0 as a%d\n", s, chunks, v->alloc[s].name);
    return v->alloc[s].name;
}

/* A new export (a new description) of slot s's allocation; -1 on failure. */
static int export_of(struct thread *t, struct fuzz_vmm *v, int s)
{
    int fd = -1;
    CUresult rc = vd.export_fd(&fd, v->alloc[s].h, FD_TYPE, 0);
    log_line(t, "vmm-export a%d -> %d", v->alloc[s].name, (int)rc);
    return rc == CUDA_SUCCESS ? fd : -1;
}

static void put_export(struct fuzz_vmm *v, int e, int fd, int name)
{
    if (v->exp[e].fd >= 0)
        close(v->exp[e].fd); /* the exporter drops that export */
    v->exp[e].fd = fd, v->exp[e].name = name, v->exp[e].desc = ++v->ndesc;
}

/* Export e exists, made (with its allocation) when it did not; 0 if it cannot be. */
static int ensure_export(struct thread *t, struct fuzz_vmm *v, int e)
{
    if (v->exp[e].fd >= 0)
        return 1;
    int s = e % VMM_ALLOCS;
    if (!v->alloc[s].live && create_in(t, v, s, 1 + (unsigned)(e % 2)) < 0)
        return 0;
    int fd = export_of(t, v, s);
    log_line(t, fd >= 0 ? " as e%d\n" : "\n", e);
    if (fd >= 0)
        put_export(v, e, fd, v->alloc[s].name);
    return fd >= 0;
}

static void do_create(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int s = (int)(r % VMM_ALLOCS);
    if (v->alloc[s].live)
        return (void)log_line(t, "vmm-create: s%d holds a%d\n", s, v->alloc[s].name);
    create_in(t, v, s, 1 + (unsigned)((r >> 8) % 2));
}

static void do_export(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int s = (int)(r % VMM_ALLOCS), e = (int)((r >> 8) % VMM_EXPORTS);
    if (!v->alloc[s].live)
        return (void)log_line(t, "vmm-export: s%d empty\n", s);
    int fd = export_of(t, v, s);
    if (fd >= 0)
        put_export(v, e, fd, v->alloc[s].name);
    log_line(t, fd >= 0 ? " as e%d\n" : "\n", e);
}

/* ---- imports, releases ---------------------------------------------------- */

static int held_with_desc(const struct fuzz_vmm *v, int desc)
{
    for (int i = 0; i < v->nheld; i++)
        if (v->held[i].desc == desc)
            return 1;
    return 0;
}

static int held_by_uid(const struct fuzz_vmm *v, int uid)
{
    for (int i = 0; i < v->nheld; i++)
        if (v->held[i].uid == uid)
            return i;
    return -1;
}

/* Imports export e (dup: as received from the exporter, a new fd number
 * closed right after); returns the held index, -1 on failure. */
static int import_export(struct thread *t, struct fuzz_vmm *v, int e, int dup_it)
{
    if (v->nheld == VMM_HELD)
        return log_line(t, "vmm-import: enough held\n"), -1;
    int fd = dup_it ? dup(v->exp[e].fd) : v->exp[e].fd;
    CUmemGenericAllocationHandle h = 0;
    CUresult rc = vd.import(&h, (void *)(intptr_t)fd, FD_TYPE);
    if (dup_it)
        close(fd);
    log_line(t, "vmm-import e%d%s (of a%d) -> %d", e, dup_it ? " received" : "", v->exp[e].name,
             (int)rc);
    if (rc != CUDA_SUCCESS)
        return log_line(t, "\n"), -1;
    int name = name_of_handle(v, h), i = v->nheld++;
    log_line(t, " names a%d as i%d\n", name, v->next_uid);
    v->held[i].h = h, v->held[i].desc = v->exp[e].desc, v->held[i].name = name;
    v->held[i].uid = v->next_uid++;
    return i;
}

/* Imports that must fail, with the driver's code. */
static void import_bad(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    static const char *const what[] = { "devnull", "minus-one", "null-out", "type-none",
                                        "type-win32", "closed-fd" };
    int k = (int)(r % 6), fd = k == 0 ? v->devnull : -1;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationHandleType type = k == 3 ? CU_MEM_HANDLE_TYPE_NONE
                                   : k == 4 ? CU_MEM_HANDLE_TYPE_WIN32 : FD_TYPE;
    if (k == 5) {
        if (nthreads > 1 || (fd = dup(v->devnull)) < 0)
            return (void)log_line(t, "vmm-import closed-fd: skipped\n");
        close(fd); /* imported right away: nothing can take the number meanwhile */
    }
    CUresult rc = vd.import(k == 2 ? NULL : &h, (void *)(intptr_t)fd, type);
    log_line(t, "vmm-import %s -> %d\n", what[k], (int)rc);
    if (rc == CUDA_SUCCESS && k != 2)
        vd.release(h); /* not expected: the diff shows the code */
}

static void do_import(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int e = (int)(r % VMM_EXPORTS), how = (int)((r >> 8) % 10);
    if (how >= 8)
        return import_bad(t, v, r >> 12);
    if (ensure_export(t, v, e))
        import_export(t, v, e, how >= 4);
}

static void remember_gone(struct fuzz_vmm *v, CUmemGenericAllocationHandle h, int desc)
{
    if (v->ngone == VMM_GONE)
        memmove(v->gone, v->gone + 1, sizeof(v->gone[0]) * --v->ngone);
    v->gone[v->ngone].h = h, v->gone[v->ngone].desc = desc;
    v->ngone++;
}

/* Releases held import i; returns the driver's code. */
static CUresult release_held(struct thread *t, struct fuzz_vmm *v, int i)
{
    CUresult rc = vd.release(v->held[i].h);
    log_line(t, "vmm-release i%d (a%d) -> %d\n", v->held[i].uid, v->held[i].name, (int)rc);
    if (rc == CUDA_SUCCESS) {
        remember_gone(v, v->held[i].h, v->held[i].desc);
        v->held[i] = v->held[--v->nheld];
    }
    return rc;
}

/* A released handle that may be used again: no other import of its
 * description is held (with the cache that one would have the same value). */
static int usable_gone(const struct fuzz_vmm *v, uint64_t r)
{
    int j = v->ngone ? (int)(r % (unsigned)v->ngone) : -1;
    return j >= 0 && (v->gone[j].desc < 0 || !held_with_desc(v, v->gone[j].desc)) ? j : -1;
}

static void do_release(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int how = (int)((r >> 8) % 10);
    if (how < 6 && v->nheld > 0)
        return (void)release_held(t, v, (int)(r % (unsigned)v->nheld));
    if (how <= 6) {
        int j = usable_gone(v, r);
        if (j < 0)
            return (void)log_line(t, "vmm-release past zero: none\n");
        return (void)log_line(t, "vmm-release past zero -> %d\n", (int)vd.release(v->gone[j].h));
    }
    if (how == 7)
        return (void)log_line(t, "vmm-release zero -> %d\n", (int)vd.release(0));
    int s = (int)(r % VMM_ALLOCS); /* the exporter's own release */
    if (!v->alloc[s].live)
        return (void)log_line(t, "vmm-release s%d: empty\n", s);
    CUresult rc = vd.release(v->alloc[s].h);
    log_line(t, "vmm-release created a%d -> %d\n", v->alloc[s].name, (int)rc);
    if (rc == CUDA_SUCCESS) {
        v->alloc[s].live = 0;
        remember_gone(v, v->alloc[s].h, -1);
    }
}

/* The exporter replaces export e's description by a new allocation's at the
 * same fd number (as a freed allocation's number is reused), then imports. */
static void do_recycle(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int e = (int)(r % VMM_EXPORTS), s = -1;
    if (!ensure_export(t, v, e))
        return;
    for (int k = 0; k < VMM_ALLOCS && s < 0; k++)
        if (v->alloc[k].live && v->alloc[k].name == v->exp[e].name)
            s = k;
    if (s >= 0) {
        CUresult rc = vd.release(v->alloc[s].h);
        log_line(t, "vmm-recycle e%d: release a%d -> %d\n", e, v->alloc[s].name, (int)rc);
        if (rc != CUDA_SUCCESS)
            return;
        v->alloc[s].live = 0;
        remember_gone(v, v->alloc[s].h, -1);
    }
    for (int k = 0; k < VMM_ALLOCS && s < 0; k++)
        if (!v->alloc[k].live)
            s = k;
    if (s < 0 || create_in(t, v, s, 1 + (unsigned)((r >> 8) % 2)) < 0)
        return (void)log_line(t, "vmm-recycle: no allocation\n");
    int fd = export_of(t, v, s);
    log_line(t, "\n");
    if (fd < 0)
        return;
    if (dup2(fd, v->exp[e].fd) < 0)
        die("dup2 failed");
    close(fd);
    v->exp[e].name = v->alloc[s].name, v->exp[e].desc = ++v->ndesc;
    import_export(t, v, e, (int)((r >> 12) % 2));
}

/* ---- reservations ----------------------------------------------------------- */

static int free_res_slot(const struct fuzz_vmm *v)
{
    for (int k = 0; k < VMM_RES; k++)
        if (!v->res[k].live)
            return k;
    return -1;
}

static int reserve(struct thread *t, struct fuzz_vmm *v, unsigned chunks, size_t align,
                   CUdeviceptr hint, const char *what);

/* One of the reservations held (r chooses), made when there is none; -1 if
 * it cannot be. */
static int live_res(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int idx[VMM_RES], n = 0;
    for (int k = 0; k < VMM_RES; k++)
        if (v->res[k].live)
            idx[n++] = k;
    if (n)
        return idx[r % (unsigned)n];
    return t ? reserve(t, v, 1 + (unsigned)(r % 4), 0, 0, "") : -1;
}

/* Reserves chunks granules (align 0 or G) in a free slot; the slot or -1. */
static int reserve(struct thread *t, struct fuzz_vmm *v, unsigned chunks, size_t align,
                   CUdeviceptr hint, const char *what)
{
    int k = free_res_slot(v);
    if (k < 0)
        return log_line(t, "vmm-reserve: enough reservations\n"), -1;
    CUdeviceptr p = 0;
    CUresult rc = vd.reserve(&p, chunks * G, align, hint, 0);
    log_line(t, "vmm-reserve %u chunk(s)%s -> %d", chunks, what, (int)rc);
    /* Single-threaded only: another thread may take a hinted range first.
     * Bigger than the freed range, it depends on what lies after, which the
     * cache's kept ranges change: not shown (seed 411250). */
    int decided = hint != v->last_freed || chunks <= v->last_freed_chunks;
    if (rc == CUDA_SUCCESS && hint && nthreads == 1 && decided)
        log_line(t, " at-hint=%d", p == hint);
    log_line(t, rc == CUDA_SUCCESS ? " as r%d\n" : "\n", k);
    if (rc != CUDA_SUCCESS)
        return -1;
    v->res[k].p = p, v->res[k].chunks = chunks, v->res[k].live = 1;
    /* The freed range may be in this one now, or not: the cache's kept
     * ranges move the driver's placement. Hinted at only while free. */
    v->last_freed = 0;
    return k;
}

static void do_reserve(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    unsigned chunks = 1 + (unsigned)(r % 6);
    int how = (int)((r >> 8) % 12), own = live_res(NULL, v, r >> 16);
    CUdeviceptr p = 0;
    if (how < 7)
        return (void)reserve(t, v, chunks, how % 2 ? G : 0, 0, "");
    if (how == 7 && v->last_freed)
        return (void)reserve(t, v, chunks, 0, v->last_freed, " hint=freed");
    if (how == 8 && own >= 0)
        return (void)reserve(t, v, chunks, 0, v->res[own].p, " hint=held");
    static const char *const what[] = { "align=3", "size=0", "size=half", "flags=1" };
    int bad = (int)((r >> 12) % 4);
    size_t size = bad == 1 ? 0 : bad == 2 ? G / 2 : chunks * G;
    CUresult rc = vd.reserve(&p, size, bad == 0 ? 3 : 0, 0, bad == 3);
    log_line(t, "vmm-reserve %s -> %d\n", what[bad], (int)rc);
    if (rc == CUDA_SUCCESS) /* not expected: the diff shows the code */
        vd.free(p, size);
}

static void forget_maps(struct fuzz_vmm *v, int k, unsigned at, unsigned chunks)
{
    for (int m = 0; m < v->nmap;)
        if (v->map[m].res == k && v->map[m].at < at + chunks && at < v->map[m].at + v->map[m].chunks)
            v->map[m] = v->map[--v->nmap];
        else
            m++;
}

static CUresult free_res(struct thread *t, struct fuzz_vmm *v, int k, int wrong_size)
{
    CUdeviceptr p = v->res[k].p;
    CUresult rc = vd.free(p, (v->res[k].chunks + (unsigned)wrong_size) * G);
    log_line(t, "vmm-free r%d%s -> %d\n", k, wrong_size ? " wrong-size" : "", (int)rc);
    if (rc == CUDA_SUCCESS) {
        v->res[k].live = 0;
        v->last_freed = p;
        v->last_freed_chunks = v->res[k].chunks;
        forget_maps(v, k, 0, v->res[k].chunks);
    }
    return rc;
}

/* Frees reservation k; then, if again, reserves there at once: the driver
 * places a hint that is free, so a range the cache kept must give way. */
static void free_then_hint(struct thread *t, struct fuzz_vmm *v, int k, int wrong_size, int again)
{
    unsigned chunks = v->res[k].chunks;
    if (free_res(t, v, k, wrong_size) == CUDA_SUCCESS && again)
        reserve(t, v, chunks, 0, v->last_freed, " hint=freed");
}

static void do_free(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int k = live_res(t, v, r);
    if (k < 0)
        return;
    free_then_hint(t, v, k, (r >> 8) % 5 == 0, (r >> 12) % 3 == 0);
}

/* ---- mappings ---------------------------------------------------------------- */

/* Maps name's handle h (held import uid, or -1) at chunk at of reservation k. */
static CUresult map_at(struct thread *t, struct fuzz_vmm *v, int k, unsigned at,
                       CUmemGenericAllocationHandle h, int uid, int name, const char *what)
{
    unsigned chunks = chunks_of_name(v, name);
    CUdeviceptr p = v->res[k].p + at * G;
    CUresult rc = vd.map(p, chunks * G, 0, h, 0);
    log_line(t, "vmm-map %s a%d at r%d+%u -> %d", what, name, k, at, (int)rc);
    if (rc == CUDA_SUCCESS) {
        log_reads(t, v, p);
        if (v->nmap < VMM_MAPS) {
            v->map[v->nmap].res = k, v->map[v->nmap].held_uid = uid, v->map[v->nmap].name = name;
            v->map[v->nmap].at = at, v->map[v->nmap].chunks = chunks;
            v->nmap++;
        }
    }
    log_line(t, "\n");
    return rc;
}

/* Maps that must fail (or, past the reservation's end, may not). */
static void map_bad(struct thread *t, struct fuzz_vmm *v, int k, unsigned at, uint64_t r)
{
    static const char *const what[] = { "unaligned", "unreserved", "zero-handle", "offset",
                                        "too-big" };
    int bad = (int)(r % 5), i = v->nheld ? (int)((r >> 4) % (unsigned)v->nheld) : -1;
    CUmemGenericAllocationHandle h = bad == 2 || i < 0 ? 0 : v->held[i].h;
    unsigned chunks = i >= 0 ? chunks_of_name(v, v->held[i].name) : 1;
    CUdeviceptr p = bad == 1 ? UNRESERVED : v->res[k].p + at * G + (bad == 0 ? G / 2 : 0);
    CUresult rc = vd.map(p, (chunks + (bad == 4)) * G, bad == 3 ? G : 0, h, 0);
    log_line(t, "vmm-map %s at r%d+%u -> %d\n", what[bad], k, at, (int)rc);
    if (rc == CUDA_SUCCESS) /* not expected: the diff shows the code */
        vd.unmap(p, (chunks + (bad == 4)) * G);
}

static void do_map(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int k = live_res(t, v, r);
    if (k < 0)
        return;
    unsigned at = (unsigned)((r >> 8) % v->res[k].chunks);
    int how = (int)((r >> 16) % 10), s = (int)((r >> 20) % VMM_ALLOCS);
    if (how < 6 && (v->nheld > 0 || (ensure_export(t, v, s) && import_export(t, v, s, 0) >= 0))) {
        int i = (int)((r >> 24) % (unsigned)v->nheld);
        map_at(t, v, k, at, v->held[i].h, v->held[i].uid, v->held[i].name, "import");
    } else if (how < 8 && v->alloc[s].live) {
        map_at(t, v, k, at, v->alloc[s].h, -1, v->alloc[s].name, "created");
    } else if (how == 8 && usable_gone(v, r >> 24) >= 0) {
        int j = usable_gone(v, r >> 24);
        CUresult rc = vd.map(v->res[k].p + at * G, G, 0, v->gone[j].h, 0);
        log_line(t, "vmm-map released at r%d+%u -> %d\n", k, at, (int)rc);
        if (rc == CUDA_SUCCESS) /* not expected: the diff shows the code */
            vd.unmap(v->res[k].p + at * G, G);
    } else {
        map_bad(t, v, k, at, r >> 28);
    }
}

/* A range of reservation k to act on: a mapping the app holds, the whole
 * reservation, or one chunk (mapped or not, maybe cutting a mapping). */
static void pick_range(const struct fuzz_vmm *v, int k, uint64_t r, unsigned *at, unsigned *n,
                       const char **what)
{
    int mine[VMM_MAPS], nm = 0;
    for (int m = 0; m < v->nmap; m++)
        if (v->map[m].res == k)
            mine[nm++] = m;
    int how = (int)(r % 4);
    if (how < 2 && nm > 0) {
        const typeof(v->map[0]) *m = &v->map[mine[(r >> 2) % (unsigned)nm]];
        *at = m->at, *n = m->chunks, *what = "mapping";
    } else if (how == 2) {
        *at = 0, *n = v->res[k].chunks, *what = "all";
    } else {
        *at = (unsigned)((r >> 2) % v->res[k].chunks), *n = 1, *what = "chunk";
    }
}

static CUresult unmap_range(struct thread *t, struct fuzz_vmm *v, int k, unsigned at, unsigned n,
                            const char *what)
{
    CUresult rc = vd.unmap(v->res[k].p + at * G, n * G);
    log_line(t, "vmm-unmap %s r%d+%u %u chunk(s) -> %d\n", what, k, at, n, (int)rc);
    if (rc == CUDA_SUCCESS)
        forget_maps(v, k, at, n);
    return rc;
}

/* A reservation (made if none) and a range of it; -1 if none can be had. */
static int pick_target(struct thread *t, struct fuzz_vmm *v, uint64_t r, unsigned *at, unsigned *n,
                       const char **what)
{
    int k = live_res(t, v, r);
    if (k >= 0)
        pick_range(v, k, r >> 8, at, n, what);
    return k;
}

static void do_unmap(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    unsigned at, n;
    const char *what;
    int k = pick_target(t, v, r, &at, &n, &what);
    if (k < 0)
        return;
    if ((r >> 20) % 8 == 0) { /* half a granule: the driver's error */
        CUresult rc = vd.unmap(v->res[k].p + at * G, G / 2);
        return (void)log_line(t, "vmm-unmap half r%d+%u -> %d\n", k, at, (int)rc);
    }
    unmap_range(t, v, k, at, n, what);
}

static CUmemAccessDesc access_desc(int dev, unsigned flags)
{
    static const CUmemAccess_flags kinds[] = { CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                                               CU_MEM_ACCESS_FLAGS_PROT_READ,
                                               CU_MEM_ACCESS_FLAGS_PROT_NONE };
    CUmemAccessDesc d;
    memset(&d, 0, sizeof(d));
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = kinds[flags % 3];
    return d;
}

/* This thread's two devices (as its contexts'). */
static int device(const struct fuzz_vmm *v, uint64_t r)
{
    return 2 * v->tid + (int)(r % 2);
}

/* Access for one or both of our devices (r chooses; rebuilt: read-write on
 * the first, as PyTorch sets it). */
static CUresult set_access(struct thread *t, struct fuzz_vmm *v, int k, unsigned at, unsigned n,
                           uint64_t r, const char *what)
{
    int rebuilt = strcmp(what, "rebuilt") == 0;
    if (rebuilt)
        r = 0;
    CUmemAccessDesc d[2] = { access_desc(device(v, r), (unsigned)(r >> 1)),
                             access_desc(device(v, r + 1), (unsigned)(r >> 3)) };
    size_t count = 1 + (r >> 5) % 2;
    int bad = !rebuilt && (r >> 6) % 12 == 0;
    if (bad)
        d[0].location.id = 99;
    CUresult rc = vd.set_access(v->res[k].p + at * G, n * G, d, count);
    log_line(t, "vmm-set-access %s r%d+%u %u chunk(s) d%d=%d", what, k, at, n,
             bad ? 99 : (int)(r % 2), (int)d[0].flags);
    if (count == 2)
        log_line(t, " d%d=%d", (int)((r + 1) % 2), (int)d[1].flags);
    log_line(t, " -> %d\n", (int)rc);
    return rc;
}

static void do_set_access(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    unsigned at, n;
    const char *what;
    int k = pick_target(t, v, r, &at, &n, &what);
    if (k >= 0)
        set_access(t, v, k, at, n, r >> 20, what);
}

static int app_maps(const struct fuzz_vmm *v, int k, unsigned at)
{
    for (int m = 0; m < v->nmap; m++)
        if (v->map[m].res == k && at >= v->map[m].at && at < v->map[m].at + v->map[m].chunks)
            return 1;
    return 0;
}

/* Access of one of our devices at a chunk; what is mapped there, if the app
 * mapped it (an unmapped chunk may hold what the cache kept: not the app's). */
static void do_get_access(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int k = live_res(t, v, r);
    if (k < 0)
        return;
    unsigned at = (unsigned)((r >> 8) % v->res[k].chunks);
    CUmemLocation loc = { CU_MEM_LOCATION_TYPE_DEVICE, device(v, r >> 16) };
    unsigned long long flags = 77;
    CUdeviceptr p = v->res[k].p + at * G;
    CUresult rc = vd.get_access(&flags, &loc, p);
    log_line(t, "vmm-get-access r%d+%u d%d -> %d flags=%llu", k, at, (int)((r >> 16) % 2),
             (int)rc, flags);
    if (app_maps(v, k, at))
        log_reads(t, v, p);
    log_line(t, "\n");
}

/* ---- whole rebuilds and releases (the consumer's own sequences) ----------- */

/* c10's ExpandableSegment::fromShared (reserve first, receive and import
 * each chunk, map, set access; extra: granules reserved past them), or
 * import first and then reserve, of exports e[0..n). The slot or -1. */
static int rebuild_exports(struct thread *t, struct fuzz_vmm *v, const int *e, int n, int torch,
                           unsigned extra)
{
    int held[3], names[3];
    unsigned total = 0;
    for (int i = 0; i < n; i++) {
        if (!ensure_export(t, v, e[i]))
            return -1;
        names[i] = v->exp[e[i]].name;
        total += chunks_of_name(v, names[i]);
    }
    log_line(t, "vmm-rebuild %s, %d export(s)\n", torch ? "reserve first" : "import first", n);
    int k = torch ? reserve(t, v, total + extra, 0, 0, "") : -1;
    if (torch && k < 0)
        return -1;
    for (int i = 0; i < n; i++)
        held[i] = import_export(t, v, e[i], torch);
    int uids[3];
    for (int i = 0; i < n; i++)
        uids[i] = held[i] >= 0 ? v->held[held[i]].uid : -1;
    if (!torch && (k = reserve(t, v, total, 0, 0, "")) < 0)
        return -1;
    unsigned at = 0;
    for (int i = 0; i < n; i++) {
        int h = held_by_uid(v, uids[i]);
        if (h >= 0)
            map_at(t, v, k, at, v->held[h].h, uids[i], v->held[h].name, "import");
        at += chunks_of_name(v, names[i]);
    }
    set_access(t, v, k, 0, total, 0, "rebuilt");
    return k;
}

static void do_rebuild(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int n = 1 + (int)(r % 3), torch = (int)((r >> 2) % 2);
    unsigned extra = torch ? (unsigned)((r >> 3) % 3) : 0;
    int e[3];
    for (int i = 0; i < n; i++)
        e[i] = (int)((r >> (5 + 3 * i)) % VMM_EXPORTS);
    rebuild_exports(t, v, e, n, torch, extra);
}

/* c10's unmapHandles: per chunk unmap and release, then free the range
 * (then a reserve at its address when hint). */
static void drop_res(struct thread *t, struct fuzz_vmm *v, int k, int hint)
{
    log_line(t, "vmm-drop r%d\n", k);
    for (int m = 0; m < v->nmap;) {
        if (v->map[m].res != k) {
            m++;
            continue;
        }
        int uid = v->map[m].held_uid;
        unmap_range(t, v, k, v->map[m].at, v->map[m].chunks, "mapping"); /* forgets map[m] */
        int i = held_by_uid(v, uid);
        if (i >= 0)
            release_held(t, v, i);
        m = 0;
    }
    free_then_hint(t, v, k, 0, hint);
}

static void do_drop(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    int k = live_res(t, v, r);
    if (k >= 0)
        drop_res(t, v, k, (r >> 8) % 3 == 0);
}

/* Step s's order of n segments: in order, reversed every other step,
 * rotated by a step's worth, or shuffled anew each step. */
static void sync_order(int *order, int n, int how, int s, uint64_t r)
{
    for (int i = 0; i < n; i++)
        order[i] = how == 1 && s % 2 ? n - 1 - i : how == 2 ? (i + s) % n : i;
    uint64_t bits = r >> (8 + 12 * s);
    for (int i = n - 1; how == 3 && i > 0; i--) {
        int j = (int)((bits >> (3 * i)) % (unsigned)(i + 1)), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
}

/*
 * Weight syncs: segments of neighbouring exports (each sharing its last
 * with the next one's first, as neighbouring tensors share a chunk), rebuilt
 * PyTorch's way for a few steps, the order changing as r picks (so that the
 * reserve's prediction is right, wrong or stale), one at a time (each
 * dropped before the next) or all at once (dropped in reverse).
 */
static void do_sync(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    enum { SEGS = 4 };
    int n = 2 + (int)(r % 3), order[SEGS], k[SEGS], how = (int)((r >> 2) % 4);
    int one_at_a_time = (int)((r >> 4) % 2), steps = 2 + (int)((r >> 5) % 3);
    for (int s = 0; s < steps; s++) {
        sync_order(order, n, how, s, r);
        log_line(t, "vmm-sync step %d: %d segment(s), order %d, %s\n", s, n, how,
                 one_at_a_time ? "one at a time" : "all at once");
        for (int i = 0; i < n; i++) {
            int e[2] = { order[i] % VMM_EXPORTS, (order[i] + 1) % VMM_EXPORTS };
            k[i] = rebuild_exports(t, v, e, 2, 1, 0);
            if (one_at_a_time && k[i] >= 0)
                drop_res(t, v, k[i], 0);
        }
        for (int i = n; !one_at_a_time && i-- > 0;)
            if (k[i] >= 0 && v->res[k[i]].live)
                drop_res(t, v, k[i], 0);
    }
}

void vmm_drain(struct thread *t, struct fuzz_vmm *v)
{
    for (int k = 0; k < VMM_RES; k++)
        if (v->res[k].live && unmap_range(t, v, k, 0, v->res[k].chunks, "all") == CUDA_SUCCESS)
            free_res(t, v, k, 0);
    while (v->nheld > 0)
        if (release_held(t, v, 0) != CUDA_SUCCESS)
            v->held[0] = v->held[--v->nheld];
}

/*
 * At the thread's end: the access of each mapping it holds, as the app sees
 * it (cuMemGetAccess), and whether the driver really grants at least that.
 * The cache may grant more: a kept chunk mapped again keeps its old access,
 * while to the app (and its get-access) the new mapping has none until set;
 * hence the final listing leaves access out.
 */
void vmm_end(struct thread *t, struct fuzz_vmm *v)
{
    for (int m = 0; m < v->nmap; m++) {
        CUdeviceptr p = v->res[v->map[m].res].p + v->map[m].at * G;
        log_line(t, "vmm-end r%d+%u", v->map[m].res, v->map[m].at);
        for (int d = 0; d < 2; d++) {
            CUmemLocation loc = { CU_MEM_LOCATION_TYPE_DEVICE, device(v, (uint64_t)d) };
            unsigned long long flags = 77;
            CUresult rc = vd.get_access(&flags, &loc, p);
            long long raw = vd.raw_access(p, loc.id);
            int covered = raw >= 0 && ((unsigned long long)raw & flags) == flags;
            log_line(t, " d%d -> %d flags=%llu%s", d, (int)rc, flags, covered ? "" : " NOT-GRANTED");
        }
        log_line(t, "\n");
    }
}

/* ---- one operation --------------------------------------------------------- */

typedef void (*vmm_op_fn)(struct thread *, struct fuzz_vmm *, uint64_t);
static const struct { vmm_op_fn fn; unsigned weight; } vmm_ops[] = {
    { do_create, 4 }, { do_export, 5 }, { do_import, 14 }, { do_release, 9 },
    { do_reserve, 6 }, { do_map, 12 }, { do_unmap, 8 }, { do_set_access, 6 },
    { do_get_access, 5 }, { do_free, 5 }, { do_recycle, 2 }, { do_rebuild, 6 },
    { do_drop, 5 }, { do_sync, 3 },
};

void vmm_op(struct thread *t, struct fuzz_vmm *v, uint64_t r)
{
    enum { N = sizeof(vmm_ops) / sizeof(vmm_ops[0]) };
    unsigned total = 0, x;
    for (int i = 0; i < N; i++)
        total += vmm_ops[i].weight;
    x = (unsigned)(r % total);
    for (int i = 0; i < N; i++) {
        if (x < vmm_ops[i].weight)
            return vmm_ops[i].fn(t, v, r / total);
        x -= vmm_ops[i].weight;
    }
}

/* ---- the end: the stand-in's live VMM state ---------------------------- */

static void name_serial(struct fuzz_vmm *const *all, int n, uint64_t serial, char *buf, size_t cap)
{
    for (int i = 0; i < n; i++) {
        int k = name_of_serial(all[i], serial);
        if (k >= 0)
            return (void)snprintf(buf, cap, "t%d.a%d", all[i]->tid, k);
    }
    snprintf(buf, cap, "unknown");
}

static int compare_lines(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* A real mapping at addr inside a range the app holds, where the app maps
 * nothing: what the cache kept after the app's unmap. */
static int kept_in_app_range(struct fuzz_vmm *const *all, int n, uint64_t addr)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < VMM_RES; k++) {
            const struct fuzz_vmm *v = all[i];
            if (v->res[k].live && addr >= v->res[k].p && addr < v->res[k].p + v->res[k].chunks * G)
                return !app_maps(v, k, (unsigned)((addr - v->res[k].p) / G));
        }
    return 0;
}

static int in_app_range(struct fuzz_vmm *const *all, int n, uint64_t addr)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < VMM_RES; k++)
            if (all[i]->res[k].live && addr >= all[i]->res[k].p &&
                addr < all[i]->res[k].p + all[i]->res[k].chunks * G)
                return 1;
    return 0;
}

/* A real import of serial the app no longer holds, while a range the app
 * holds maps it (the app's mapping, or one the cache kept there): the cache
 * keeps the import as long as that mapping, which holds the memory anyway. */
static int import_kept_for_mapping(struct fuzz_vmm *const *all, int n,
                                   const struct fakevmm_item *items, size_t count, uint64_t serial)
{
    for (int i = 0; i < n; i++)
        for (int h = 0; h < all[i]->nheld; h++)
            if (all[i]->held[h].name >= 0 && all[i]->serials[all[i]->held[h].name] == serial)
                return 0;
    for (size_t i = 0; i < count; i++)
        if (items[i].kind == FAKEVMM_MAPPING && items[i].serial == serial &&
            in_app_range(all, n, items[i].addr))
            return 1;
    return 0;
}

/*
 * Runs after ipccache's exit-time release (see fuzz.c), which really
 * releases what it kept idle. Imports are listed once per allocation, not
 * counted: the app's repeated imports of one export are one real import
 * with the cache. Mappings (access: see vmm_end) and reservations are listed
 * one by one, except a mapping the cache kept in a range the app still
 * holds: the exit release leaves that range (the app's) and so what is in
 * it, and the process's end unmaps it; what the app maps is listed exactly.
 * For the same reason an import the app released is not listed while such a
 * mapping of it remains (import_kept_for_mapping).
 */
void vmm_final(struct fuzz_vmm *const *all, int n)
{
    enum { MAX_ITEMS = 1024, LINE = 96 };
    static struct fakevmm_item items[MAX_ITEMS];
    static char lines[MAX_ITEMS][LINE];
    size_t count = vd.list(items, MAX_ITEMS), kept = 0;
    if (count > MAX_ITEMS)
        count = MAX_ITEMS;
    for (size_t i = 0; i < count; i++) {
        const struct fakevmm_item *it = &items[i];
        if ((it->kind == FAKEVMM_MAPPING && kept_in_app_range(all, n, it->addr)) ||
            (it->kind == FAKEVMM_IMPORTED &&
             import_kept_for_mapping(all, n, items, count, it->serial)))
            continue;
        char name[32];
        name_serial(all, n, it->serial, name, sizeof(name));
        unsigned chunks = (unsigned)(it->size / G);
        if (it->kind == FAKEVMM_IMPORTED)
            snprintf(lines[kept], LINE, "final vmm import of %s", name);
        else if (it->kind == FAKEVMM_CREATED)
            snprintf(lines[kept], LINE, "final vmm created %s", name);
        else if (it->kind == FAKEVMM_RESERVATION)
            snprintf(lines[kept], LINE, "final vmm reservation %u chunk(s)", chunks);
        else
            snprintf(lines[kept], LINE, "final vmm mapping of %s %u chunk(s)", name, chunks);
        if (it->kind != FAKEVMM_IMPORTED || kept == 0 ||
            !bsearch(lines[kept], lines, kept, LINE, compare_lines))
            qsort(lines, ++kept, LINE, compare_lines);
    }
    for (size_t i = 0; i < kept; i++)
        printf("%s\n", lines[i]);
    printf("final vmm: %zu item(s)\n", kept);
}
