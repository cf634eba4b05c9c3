/*
 * fake_vmm.c - the stand-in driver's virtual memory management calls
 * (cuMemCreate, export/import of shareable handles, reserve, map, access,
 * unmap, release, address free), built into tests' libcuda.so.1.
 *
 * Every answer is the H200's, as tests/gpu/vmm_errors.cu measured it
 * (docs/vmm.md). Where the real driver crashes (a handle it never gave
 * out or already took back), the model answers CUDA_ERROR_INVALID_VALUE and
 * counts a stale use, so a test can prove the cache never passes one on.
 *
 * An exported POSIX fd is a socket with (magic, exporter pid, allocation
 * serial, size) queued, read without being taken: like the driver's, each
 * export is a new open file description, every dup of it or fd received
 * from it names the same one, it works across processes, and it can be
 * polled (the driver's /dev/nvidiactl can: its file operations have poll,
 * which the library's marks of its kept dups need, base/fdmark.c). A file
 * holding the same bytes imports too (a test's forged export). Fabric
 * handles carry the same bytes.
 * No device memory; no context needed (the driver needs none either).
 */
#define _GNU_SOURCE
#include <cuda.h>

#include "fake_vmm.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define G FAKEVMM_GRANULARITY
#define VA_BASE 0x500000000000ULL
#define MAX_HANDLES 4096
#define MAX_RES 1024
#define MAX_MAPS 8192
#define MAX_DEV 16
#define EXPORT_MAGIC "FAKEVMM1"

struct export_blob {
    char magic[8];
    uint64_t pid, serial, size;
};

struct vhandle { int used; uint32_t gen; uint64_t pid, serial, size; int created; };
struct vres { int used; uint64_t addr, size; };
struct vmap {
    int used;
    uint64_t addr, size, pid, serial;
    unsigned long long access[MAX_DEV];
};

static pthread_mutex_t v_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vhandle v_handles[MAX_HANDLES];
static struct vres v_res[MAX_RES];
static struct vmap v_maps[MAX_MAPS];
static uint64_t v_next_serial = 1;
static uint32_t v_next_gen = 1;
static struct fakevmm_counters v_cnt;

/* The "physical memory" block at the end of this file. */
static void phys_created(const struct vhandle *v);
static void phys_released(const struct vhandle *v);
static void phys_held(uint64_t pid, uint64_t serial, int delta);

static void vlock(void) { pthread_mutex_lock(&v_lock); }
static void vunlock(void) { pthread_mutex_unlock(&v_lock); }
static CUresult vunlock_ret(CUresult rc) { vunlock(); return rc; }

__attribute__((constructor)) static void fake_vmm_fork_safety(void)
{
    pthread_atfork(vlock, vunlock, vunlock);
}

/* A limit from the environment; dflt when unset or not a number. */
static long setting(const char *name, long dflt)
{
    const char *s = getenv(name);
    return s && *s >= '0' && *s <= '9' ? atol(s) : dflt;
}

static int devices(void)
{
    long n = setting("FAKECUDA_DEVICES", 2);
    return n < 0 ? 0 : n > MAX_DEV ? MAX_DEV : (int)n;
}

/* ---- handles: value = generation << 16 | slot + 1, never 0 ---- */

static struct vhandle *handle_of(CUmemGenericAllocationHandle h)
{
    uint64_t slot = (h & 0xffff);
    if (slot == 0 || slot > MAX_HANDLES) return NULL;
    struct vhandle *v = &v_handles[slot - 1];
    return v->used && v->gen == (uint32_t)(h >> 16) ? v : NULL;
}

/* A new handle; OUT_OF_MEMORY past FAKECUDA_VMM_MAX_HANDLES live ones. */
static CUresult new_handle(CUmemGenericAllocationHandle *out, uint64_t pid, uint64_t serial,
                           uint64_t size)
{
    if (v_cnt.live_handles >= setting("FAKECUDA_VMM_MAX_HANDLES", MAX_HANDLES))
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < MAX_HANDLES; i++) {
        if (v_handles[i].used) continue;
        v_handles[i] = (struct vhandle){ 1, v_next_gen++, pid, serial, size, 0 };
        *out = ((uint64_t)v_handles[i].gen << 16) | (uint64_t)(i + 1);
        v_cnt.live_handles++;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option)
{
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = G;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!h || !prop || size == 0 || size % G || flags) return CUDA_ERROR_INVALID_VALUE;
    vlock();
    CUresult rc = new_handle(h, (uint64_t)getpid(), v_next_serial++, size);
    if (rc == CUDA_SUCCESS) {
        v_cnt.creates++;
        handle_of(*h)->created = 1;
        phys_created(handle_of(*h));
    }
    return vunlock_ret(rc);
}

static void blob_of(const struct vhandle *v, struct export_blob *b)
{
    memset(b, 0, sizeof *b);
    memcpy(b->magic, EXPORT_MAGIC, 8);
    b->pid = v->pid;
    b->serial = v->serial;
    b->size = v->size;
}

/* Every export is a new socket: a new open file description, its blob
 * queued from the pair's other end, closed at once. */
static CUresult export_fd(int *out, const struct export_blob *b)
{
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ssize_t sent = send(pair[1], b, sizeof *b, 0);
    close(pair[1]);
    if (sent != (ssize_t)sizeof *b) {
        close(pair[0]);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = pair[0];
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
                                              CUmemAllocationHandleType type,
                                              unsigned long long flags)
{
    if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
    vlock();
    struct vhandle *v = handle_of(h);
    if (!v) {
        v_cnt.stale_handle_uses++;
        return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    }
    struct export_blob b;
    blob_of(v, &b);
    CUresult rc = CUDA_SUCCESS;
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        rc = export_fd((int *)out, &b);
    else if (type == CU_MEM_HANDLE_TYPE_FABRIC)
        memset(out, 0, sizeof(CUmemFabricHandle)), memcpy(out, &b, sizeof b);
    else
        rc = CUDA_ERROR_NOT_SUPPORTED;
    if (rc == CUDA_SUCCESS) v_cnt.exports++;
    return vunlock_ret(rc);
}

/* A closed fd, -1, /dev/null or a pipe: the driver says UNKNOWN. */
static CUresult read_export(void *os, CUmemAllocationHandleType type, struct export_blob *b)
{
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        int fd = (int)(intptr_t)os;
        if (recv(fd, b, sizeof *b, MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof *b &&
            pread(fd, b, sizeof *b, 0) != (ssize_t)sizeof *b)
            return CUDA_ERROR_UNKNOWN;
    } else {
        if (!os) return CUDA_ERROR_INVALID_VALUE;
        memcpy(b, os, sizeof *b);
    }
    return memcmp(b->magic, EXPORT_MAGIC, 8) == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
                                                CUmemAllocationHandleType type)
{
    vlock();
    v_cnt.import_calls++;
    vunlock();
    if (!h || type == CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && type != CU_MEM_HANDLE_TYPE_FABRIC)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct export_blob b;
    CUresult rc = read_export(os, type, &b);
    if (rc != CUDA_SUCCESS) return rc;
    vlock();
    rc = new_handle(h, b.pid, b.serial, b.size); /* a new handle every time */
    if (rc == CUDA_SUCCESS) {
        v_cnt.imports++;
        phys_held(b.pid, b.serial, +1);
    }
    return vunlock_ret(rc);
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle h)
{
    vlock();
    v_cnt.release_calls++;
    struct vhandle *v = handle_of(h);
    if (!v) {
        if (h) v_cnt.stale_handle_uses++;
        return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    }
    v->used = 0; /* mappings keep the memory; the handle is gone */
    phys_released(v);
    v_cnt.live_handles--;
    v_cnt.releases++;
    return vunlock_ret(CUDA_SUCCESS);
}

/* ---- reservations ---- */

static int overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
    return a < b + bn && b < a + an;
}

static int va_free(uint64_t addr, uint64_t size)
{
    for (int i = 0; i < MAX_RES; i++)
        if (v_res[i].used && overlaps(addr, size, v_res[i].addr, v_res[i].size)) return 0;
    return 1;
}

/* The reservation holding all of [addr, addr+size); NULL if none. */
static struct vres *res_holding(uint64_t addr, uint64_t size)
{
    for (int i = 0; i < MAX_RES; i++) {
        struct vres *r = &v_res[i];
        if (r->used && addr >= r->addr && addr + size <= r->addr + r->size) return r;
    }
    return NULL;
}

static uint64_t reserved_bytes(void)
{
    uint64_t n = 0;
    for (int i = 0; i < MAX_RES; i++)
        if (v_res[i].used) n += v_res[i].size;
    return n;
}

/* The hint if it is free (as a just-freed range is), else the lowest fit. */
static uint64_t place(uint64_t size, uint64_t align, uint64_t hint)
{
    if (hint && va_free(hint, size)) return hint;
    for (uint64_t a = VA_BASE;; a += align)
        if (va_free(a, size)) return a;
}

static int power_of_two(uint64_t v) { return v && !(v & (v - 1)); }

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
                                     CUdeviceptr addr, unsigned long long flags)
{
    if (!ptr || size == 0 || size % G || flags || addr % G ||
        (align && !power_of_two(align)))
        return CUDA_ERROR_INVALID_VALUE;
    vlock();
    v_cnt.reserve_calls++;
    long cap = setting("FAKECUDA_VMM_MAX_RESERVED_MB", 0);
    if (cap > 0 && reserved_bytes() + size > (uint64_t)cap << 20)
        return vunlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < MAX_RES; i++) {
        if (v_res[i].used) continue;
        uint64_t a = place(size, align > G ? align : G, addr);
        v_res[i] = (struct vres){ 1, a, size };
        *ptr = a;
        v_cnt.reserves++;
        v_cnt.live_reservations++;
        return vunlock_ret(CUDA_SUCCESS);
    }
    return vunlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
}

static int has_mapping_in(uint64_t addr, uint64_t size)
{
    for (int i = 0; i < MAX_MAPS; i++)
        if (v_maps[i].used && overlaps(addr, size, v_maps[i].addr, v_maps[i].size)) return 1;
    return 0;
}

/* ---- calls made slow: FAKECUDA_VMM_SLOW_UNMAP_MS, FAKECUDA_VMM_SLOW_FREE_MS ---- */

static atomic_int unmaps_under_way, frees_under_way;

int fakevmm_unmaps_under_way(void)
{
    return atomic_load(&unmaps_under_way);
}

int fakevmm_frees_under_way(void)
{
    return atomic_load(&frees_under_way);
}

/* With the setting name above 0, the call waits that many ms before it
 * acts (counted in *under_way meanwhile), to widen a race window. */
static CUresult widened(const char *name, atomic_int *under_way,
                        CUresult (*now)(CUdeviceptr, size_t), CUdeviceptr ptr, size_t size)
{
    long ms = setting(name, 0);
    if (ms <= 0)
        return now(ptr, size);
    atomic_fetch_add(under_way, 1);
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&t, &t) != 0)
        ;
    CUresult rc = now(ptr, size);
    atomic_fetch_sub(under_way, 1);
    return rc;
}

static CUresult address_free_now(CUdeviceptr ptr, size_t size);

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    return widened("FAKECUDA_VMM_SLOW_FREE_MS", &frees_under_way, address_free_now, ptr, size);
}

static CUresult address_free_now(CUdeviceptr ptr, size_t size)
{
    vlock();
    v_cnt.address_free_calls++;
    for (int i = 0; i < MAX_RES; i++) {
        struct vres *r = &v_res[i];
        if (!r->used || r->addr != ptr || r->size != size) continue;
        if (has_mapping_in(r->addr, r->size)) break;
        r->used = 0;
        v_cnt.address_frees++;
        v_cnt.live_reservations--;
        return vunlock_ret(CUDA_SUCCESS);
    }
    return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
}

/* ---- mappings ---- */

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle h, unsigned long long flags)
{
    vlock();
    v_cnt.map_calls++;
    if (flags || size == 0 || ptr % G || size % G || h == 0 || !res_holding(ptr, size) ||
        has_mapping_in(ptr, size))
        return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    struct vhandle *v = handle_of(h);
    if (!v) {
        v_cnt.stale_handle_uses++;
        return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    }
    if (offset || size != v->size) return vunlock_ret(CUDA_ERROR_NOT_SUPPORTED);
    for (int i = 0; i < MAX_MAPS; i++) {
        if (v_maps[i].used) continue;
        memset(&v_maps[i], 0, sizeof v_maps[i]);
        v_maps[i] = (struct vmap){ .used = 1, .addr = ptr, .size = size,
                                   .pid = v->pid, .serial = v->serial };
        phys_held(v->pid, v->serial, +1);
        v_cnt.maps++;
        v_cnt.live_mappings++;
        return vunlock_ret(CUDA_SUCCESS);
    }
    return vunlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
}

/* A range that cuts a mapping; holes are fine. */
static int cuts_a_mapping(uint64_t addr, uint64_t size)
{
    for (int i = 0; i < MAX_MAPS; i++) {
        struct vmap *m = &v_maps[i];
        if (m->used && overlaps(addr, size, m->addr, m->size) &&
            (m->addr < addr || m->addr + m->size > addr + size))
            return 1;
    }
    return 0;
}

static CUresult unmap_now(CUdeviceptr ptr, size_t size);

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    return widened("FAKECUDA_VMM_SLOW_UNMAP_MS", &unmaps_under_way, unmap_now, ptr, size);
}

static CUresult unmap_now(CUdeviceptr ptr, size_t size)
{
    vlock();
    v_cnt.unmap_calls++;
    if (size == 0 || ptr % G || size % G || !res_holding(ptr, size) || cuts_a_mapping(ptr, size))
        return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    for (int i = 0; i < MAX_MAPS; i++) {
        struct vmap *m = &v_maps[i];
        if (m->used && overlaps(ptr, size, m->addr, m->size)) {
            m->used = 0;
            phys_held(m->pid, m->serial, -1);
            v_cnt.unmaps++;
            v_cnt.live_mappings--;
        }
    }
    return vunlock_ret(CUDA_SUCCESS);
}

/* ---- access ---- */

/* Bytes of [addr, addr+size) that mappings cover. */
static uint64_t mapped_bytes(uint64_t addr, uint64_t size)
{
    uint64_t n = 0;
    for (int i = 0; i < MAX_MAPS; i++)
        if (v_maps[i].used && overlaps(addr, size, v_maps[i].addr, v_maps[i].size))
            n += v_maps[i].size;
    return n;
}

static int valid_desc(const CUmemAccessDesc *d)
{
    return d->location.type == CU_MEM_LOCATION_TYPE_DEVICE && d->location.id >= 0 &&
           d->location.id < devices() &&
           (d->flags == CU_MEM_ACCESS_FLAGS_PROT_NONE ||
            d->flags == CU_MEM_ACCESS_FLAGS_PROT_READ ||
            d->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count)
{
    vlock();
    v_cnt.set_access_calls++;
    if (!desc || count == 0 || size == 0 || ptr % G || size % G)
        return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    for (size_t k = 0; k < count; k++)
        if (!valid_desc(&desc[k])) return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    /* Whole mappings, no holes: covered bytes equal the range's. */
    if (cuts_a_mapping(ptr, size) || mapped_bytes(ptr, size) != size)
        return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    for (int i = 0; i < MAX_MAPS; i++) {
        struct vmap *m = &v_maps[i];
        if (!m->used || !overlaps(ptr, size, m->addr, m->size)) continue;
        for (size_t k = 0; k < count; k++)
            m->access[desc[k].location.id] = desc[k].flags;
    }
    v_cnt.set_accesses++;
    return vunlock_ret(CUDA_SUCCESS);
}

static struct vmap *map_at(uint64_t ptr)
{
    for (int i = 0; i < MAX_MAPS; i++)
        if (v_maps[i].used && ptr >= v_maps[i].addr && ptr < v_maps[i].addr + v_maps[i].size)
            return &v_maps[i];
    return NULL;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc,
                                CUdeviceptr ptr)
{
    if (!flags || !loc) return CUDA_ERROR_INVALID_VALUE;
    if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE || loc->id < 0 || loc->id >= devices())
        return CUDA_ERROR_INVALID_DEVICE;
    vlock();
    struct vmap *m = map_at(ptr);
    *flags = m ? m->access[loc->id] : 0; /* the driver clears it on failure */
    if (!m) return vunlock_ret(CUDA_ERROR_INVALID_VALUE);
    return vunlock_ret(CUDA_SUCCESS);
}

/* ---- resolver rows and test hooks ---- */

#define ROW(name) { #name, 10020, (void *)name }
static const struct { const char *name; int version; void *fn; } v_syms[] = {
    ROW(cuMemGetAllocationGranularity), ROW(cuMemCreate),
    ROW(cuMemExportToShareableHandle), ROW(cuMemImportFromShareableHandle),
    ROW(cuMemRelease), ROW(cuMemAddressReserve), ROW(cuMemAddressFree),
    ROW(cuMemMap), ROW(cuMemUnmap), ROW(cuMemSetAccess), ROW(cuMemGetAccess),
};

void *fakevmm_proc(const char *symbol, int version, int *known)
{
    for (size_t i = 0; i < sizeof v_syms / sizeof v_syms[0]; i++) {
        if (strcmp(v_syms[i].name, symbol) != 0) continue;
        *known = 1;
        return version >= v_syms[i].version ? v_syms[i].fn : NULL;
    }
    return NULL;
}

void fakevmm_get_counters(struct fakevmm_counters *out)
{
    vlock();
    *out = v_cnt;
    vunlock();
}

long long fakevmm_access(CUdeviceptr ptr, int dev)
{
    vlock();
    struct vmap *m = map_at(ptr);
    long long f = m && dev >= 0 && dev < MAX_DEV ? (long long)m->access[dev] : -1;
    vunlock();
    return f;
}

/* Whether the mapping at ptr is of the allocation h (any live handle of it)
 * names: the test's check that a cached mapping is the right memory. */
int fakevmm_maps_allocation(CUdeviceptr ptr, CUmemGenericAllocationHandle h)
{
    vlock();
    struct vmap *m = map_at(ptr);
    struct vhandle *v = handle_of(h);
    int same = m && v && m->pid == v->pid && m->serial == v->serial;
    vunlock();
    return same;
}

int fakevmm_handle_allocation(CUmemGenericAllocationHandle h, uint64_t *pid, uint64_t *serial)
{
    vlock();
    struct vhandle *v = handle_of(h);
    if (v)
        *pid = v->pid, *serial = v->serial;
    vunlock();
    return v != NULL;
}

int fakevmm_allocation_at(CUdeviceptr ptr, uint64_t *pid, uint64_t *serial)
{
    vlock();
    struct vmap *m = map_at(ptr);
    if (m)
        *pid = m->pid, *serial = m->serial;
    vunlock();
    return m != NULL;
}

static void list_put(struct fakevmm_item *out, size_t cap, size_t *n, struct fakevmm_item item)
{
    if (*n < cap)
        out[*n] = item;
    (*n)++;
}

_Static_assert(sizeof(((struct fakevmm_item *)0)->access) == sizeof(((struct vmap *)0)->access),
               "fakevmm_item lists every device's access");

size_t fakevmm_list(struct fakevmm_item *out, size_t cap)
{
    size_t n = 0;
    vlock();
    for (int i = 0; i < MAX_HANDLES; i++) {
        const struct vhandle *v = &v_handles[i];
        if (v->used)
            list_put(out, cap, &n, (struct fakevmm_item){
                v->created ? FAKEVMM_CREATED : FAKEVMM_IMPORTED, v->pid, v->serial, 0, v->size, { 0 } });
    }
    for (int i = 0; i < MAX_MAPS; i++) {
        const struct vmap *m = &v_maps[i];
        if (!m->used) continue;
        struct fakevmm_item item = { FAKEVMM_MAPPING, m->pid, m->serial, m->addr, m->size, { 0 } };
        memcpy(item.access, m->access, sizeof item.access);
        list_put(out, cap, &n, item);
    }
    for (int i = 0; i < MAX_RES; i++)
        if (v_res[i].used)
            list_put(out, cap, &n, (struct fakevmm_item){ FAKEVMM_RESERVATION, 0, 0, v_res[i].addr,
                                                         v_res[i].size, { 0 } });
    vunlock();
    return n;
}

/* After the process's atexit handlers: what was left behind. */
__attribute__((destructor)) static void fake_vmm_counters_at_exit(void)
{
    const char *path = getenv("FAKECUDA_VMM_COUNTERS_AT_EXIT");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (!f) return;
    struct fakevmm_counters c;
    fakevmm_get_counters(&c);
    fprintf(f, "imports=%" PRIu64 " maps=%" PRIu64 " unmaps=%" PRIu64 " releases=%" PRIu64
            " address_frees=%" PRIu64 " live_handles=%" PRId64 " live_mappings=%" PRId64
            " live_reservations=%" PRId64 " stale=%" PRIu64 "\n",
            c.imports, c.maps, c.unmaps, c.releases, c.address_frees, c.live_handles,
            c.live_mappings, c.live_reservations, c.stale_handle_uses);
    fclose(f);
}

/* ==== "physical" memory (fake_cuda.c's book, FAKECUDA_PHYS_DIR) ============
 *
 * A VMM allocation's memory stays while its creator has not released its
 * handle (and runs), or any live process holds an imported handle of it or
 * maps it - as the driver does. Booked under serials of their own, apart
 * from cuMemAlloc's. */
#define PHYS_VMM_SERIAL(s) ((s) | (1ULL << 62))

void fakecuda_phys_alloc(uint64_t serial, uint64_t bytes);
void fakecuda_phys_free(uint64_t serial);
void fakecuda_phys_hold(uint64_t owner, uint64_t serial, int delta);

static void phys_created(const struct vhandle *v)
{
    fakecuda_phys_alloc(PHYS_VMM_SERIAL(v->serial), v->size);
}

static void phys_released(const struct vhandle *v)
{
    if (v->created)
        fakecuda_phys_free(PHYS_VMM_SERIAL(v->serial));
    else
        fakecuda_phys_hold(v->pid, PHYS_VMM_SERIAL(v->serial), -1);
}

static void phys_held(uint64_t pid, uint64_t serial, int delta)
{
    fakecuda_phys_hold(pid, PHYS_VMM_SERIAL(serial), delta);
}
