/*
 * fake_cuda.c - a stand-in libcuda.so.1 for ipccache's GPU-less tests.
 *
 * Mimics the driver's context and IPC semantics (per-context refcounted
 * mappings, reused context addresses, teardown on context destruction that
 * unmaps the context's mappings and frees its cuMemAlloc allocations,
 * versioned cuGetProcAddress) and counts real maps and unmaps, so a test can
 * tell a cache hit from driver work.  No device memory: addresses are made up.
 */
#define _GNU_SOURCE
#include <cuda.h>

/* cuda.h renames these to their newest ABI; the real driver exports every
 * spelling, so the fake must be able to define both. */
#undef cuIpcOpenMemHandle
#undef cuGetProcAddress
#undef cuCtxDestroy
#undef cuCtxCreate
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemGetAddressRange
#undef cuMemcpyHtoD
#undef cuMemcpyDtoH

#include "fake_cuda.h"
#include "fake_vmm.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Spellings freed by the #undefs above; cuda.h declared only the renamed
 * ones.  cuGetProcAddress here is the 4-argument CUDA 11.3 ABI. */
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle h,
                                    unsigned int flags);
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version,
                                  cuuint64_t flags);
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx);
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx);
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize,
                                      CUdeviceptr dptr);

#define MAX_CTX 64
#define MAX_DEVICES 16
#define STACK_DEPTH 64
#define MAX_ALLOCS 1024
/* Allocation i lives at ALLOC_BASE + i * ALLOC_STRIDE, so a freed slot's
 * address comes back for the next allocation, as real allocators do. */
#define ALLOC_BASE 0x100000000000ULL
#define ALLOC_STRIDE (1ULL << 34)
#define IPC_BASE 0x7f0000000000ULL
#define IPC_STRIDE (1ULL << 32)

struct fctx {
    int used, primary;
    CUdevice dev;
    unsigned int flags;
    unsigned long long id; /* fresh per creation: tells reused slots apart */
};
struct fprimary { int active, refs, slot; unsigned int flags; };
/* An allocation belongs to the context current at its cuMemAlloc (ctx: its
 * slot, ctx_id: its id), whose teardown frees it. */
struct falloc { int used, ctx; size_t size; uint64_t serial; unsigned long long ctx_id; };
struct fmap {
    int ctx;              /* pool slot of the owning context */
    uint64_t pid, serial; /* the exported allocation */
    CUdeviceptr addr;
    size_t size;
    int refs;
};
/* A current-context stack entry; the id detects a slot reused since. */
struct tls_entry { CUcontext h; unsigned long long id; };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fctx g_ctx[MAX_CTX];
static unsigned long long g_next_ctx_id = 1;
static struct fprimary g_primary[MAX_DEVICES];
static struct falloc g_alloc[MAX_ALLOCS];
static uint64_t g_next_serial = 1;
static uint64_t g_next_nonce = 1;
static struct fmap *g_maps;
static size_t g_nmaps, g_capmaps;
static struct fakecuda_counters g_cnt;
static int g_deinit;
static pthread_once_t g_atexit_once = PTHREAD_ONCE_INIT;

static __thread struct tls_entry t_stack[STACK_DEPTH];
static __thread int t_depth;

/* A thread that pushed a destroyed context's pointer. The real driver (H200,
 * 580) answers that push with success and aborts the process at the thread's
 * next call (tests/gpu/ctx_ids.c): every call checks this first. */
static __thread int t_pushed_dead;
static void abort_if_pushed_dead(void)
{
    if (t_pushed_dead) {
        static const char msg[] = "fakecuda: a destroyed context was pushed; aborting as the driver does\n";
        (void)!write(2, msg, sizeof msg - 1);
        abort();
    }
}
#define CHECK_DEINIT() do { abort_if_pushed_dead(); if (is_deinit()) return CUDA_ERROR_DEINITIALIZED; } while (0)

/* The "physical memory" block at the end of this file. */
static int capture_forbids_unsafe_calls(void);
static void phys_note_alloc(uint64_t serial, uint64_t bytes);
static void phys_note_free(uint64_t serial);
static void phys_note_map(uint64_t owner, uint64_t serial, int delta);
static int phys_exporter_exited(uint64_t owner, uint64_t serial);

/* ---- environment and small helpers ---- */

static long env_long(const char *name, long dflt)
{
    const char *s = getenv(name);
    char *end;
    if (!s || !*s) return dflt;
    long v = strtol(s, &end, 10);
    return *end ? dflt : v;
}

/* Read on every use so a test may change them with setenv() between calls. */
static int driver_version(void) { return (int)env_long("FAKECUDA_DRIVER_VERSION", 13000); }
static int no_ctxgetid(void) { return env_long("FAKECUDA_NO_CTXGETID", 0) != 0; }

static int device_count(void)
{
    long n = env_long("FAKECUDA_DEVICES", 2);
    return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : (int)n;
}

static int valid_device(CUdevice dev) { return dev >= 0 && dev < device_count(); }
static int is_deinit(void) { return __atomic_load_n(&g_deinit, __ATOMIC_ACQUIRE); }
static void lock(void) { pthread_mutex_lock(&g_lock); }
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

/* A fork while another thread holds the lock must not leave it held in the
 * child forever (a real driver's state is unusable after fork anyway; the
 * tests still call the fake there). */
__attribute__((constructor)) static void fake_fork_safety(void)
{
    pthread_atfork(lock, unlock, unlock);
}
static CUresult unlock_ret(CUresult rc) { unlock(); return rc; }

/* ---- contexts (lock held unless noted) ---- */

static CUcontext handle_of(int slot) { return (CUcontext)(void *)&g_ctx[slot]; }

/* Pool slot of a live context, or -1.  Works on any pointer value, so a
 * stale or garbage handle yields an error instead of a crash. A slot's used
 * and id are written atomically (under the lock): current_id reads them
 * without it. */
static int slot_of(CUcontext c)
{
    uintptr_t p = (uintptr_t)c, base = (uintptr_t)g_ctx;
    if (p < base || p >= base + sizeof g_ctx || (p - base) % sizeof g_ctx[0]) return -1;
    int s = (int)((p - base) / sizeof g_ctx[0]);
    return __atomic_load_n(&g_ctx[s].used, __ATOMIC_ACQUIRE) ? s : -1;
}

/* Whether c is the address of a context slot, live or destroyed. */
static int was_a_context(CUcontext c)
{
    uintptr_t p = (uintptr_t)c, base = (uintptr_t)g_ctx;
    return p >= base && p < base + sizeof g_ctx && (p - base) % sizeof g_ctx[0] == 0;
}

/* The calling thread's current context, -1 if none or destroyed since. */
static int current_slot(void)
{
    if (t_depth == 0) return -1;
    struct tls_entry *e = &t_stack[t_depth - 1];
    int s = slot_of(e->h);
    return s >= 0 && g_ctx[s].id == e->id ? s : -1;
}

/* Why there is no current context: the driver tells a current context
 * destroyed (by another thread; or at its address a new one since, which
 * this thread never made current) from none at all. */
static CUresult no_current_error(void)
{
    return t_depth ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
}

/* Lowest free slot, so a destroy + create hands out the same address. */
static int ctx_alloc(CUdevice dev, unsigned int flags, int primary)
{
    for (int s = 0; s < MAX_CTX; s++) {
        if (!g_ctx[s].used) {
            g_ctx[s].primary = primary;
            g_ctx[s].dev = dev;
            g_ctx[s].flags = flags;
            __atomic_store_n(&g_ctx[s].id, g_next_ctx_id++, __ATOMIC_RELAXED);
            __atomic_store_n(&g_ctx[s].used, 1, __ATOMIC_RELEASE);
            return s;
        }
    }
    return -1;
}

static void push_current(int s)
{
    t_stack[t_depth++] = (struct tls_entry){handle_of(s), g_ctx[s].id};
}

static void remove_map(size_t i)
{
    phys_note_map(g_maps[i].pid, g_maps[i].serial, -1);
    g_maps[i] = g_maps[--g_nmaps];
    g_cnt.live_mappings--;
}

static void alloc_release(int i)
{
    g_alloc[i].used = 0;
    phys_note_free(g_alloc[i].serial);
}

static void ctx_destroy(int s)
{
    /* The driver unmaps everything the context had open, and frees what it
     * allocated (cuMemAlloc; not cuMemCreate's, which belong to no context). */
    for (size_t i = g_nmaps; i-- > 0;) {
        if (g_maps[i].ctx == s) {
            remove_map(i);
            g_cnt.teardown_unmaps++;
        }
    }
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (g_alloc[i].used && g_alloc[i].ctx == s && g_alloc[i].ctx_id == g_ctx[s].id)
            alloc_release(i);
    if (g_ctx[s].primary) {
        g_primary[g_ctx[s].dev].active = 0;
        g_primary[g_ctx[s].dev].refs = 0;
    }
    /* Only this thread's stack is cleaned; others keep a dangling entry. */
    int kept = 0;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i].h != handle_of(s)) t_stack[kept++] = t_stack[i];
    t_depth = kept;
    __atomic_store_n(&g_ctx[s].used, 0, __ATOMIC_RELEASE);
}

/* ---- initialization, devices, errors ---- */

static void register_deinit_at_exit(void)
{
    /* atexit runs handlers last-in first-out: anything registered before
     * cuInit (a library's load-time handler, its destructor) runs after
     * this and meets a torn-down driver, as after cudart's teardown. */
    if (env_long("FAKECUDA_DEINIT_AT_EXIT", 0) == 1)
        atexit(fakecuda_deinit);
}

CUresult CUDAAPI cuInit(unsigned int flags)
{
    CHECK_DEINIT();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_atexit_once, register_deinit_at_exit);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int *v)
{
    CHECK_DEINIT();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = driver_version();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal)
{
    CHECK_DEINIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    CHECK_DEINIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count();
    return CUDA_SUCCESS;
}

#define ERR(code, text) {code, #code, text}
static const struct {
    CUresult code;
    const char *name, *text;
} g_errors[] = {
    ERR(CUDA_SUCCESS, "no error"),
    ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};

/* Pure table lookups: they keep working after deinit, like the real ones. */
static CUresult error_lookup(CUresult e, const char **out, int want_name)
{
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        if (g_errors[i].code == e) {
            *out = want_name ? g_errors[i].name : g_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult e, const char **s) { return error_lookup(e, s, 0); }
CUresult CUDAAPI cuGetErrorName(CUresult e, const char **s) { return error_lookup(e, s, 1); }

/* ---- context API ---- */

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CHECK_DEINIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    int s = t_depth < STACK_DEPTH ? ctx_alloc(dev, flags, 0) : -1;
    if (s >= 0) {
        push_current(s);
        *pctx = handle_of(s);
    }
    unlock();
    return s >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return cuCtxCreate_v2(pctx, flags, dev);
}

/* What CUDA 13's cuda.h calls cuCtxCreate; creation parameters ignored. */
CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params,
                                unsigned int flags, CUdevice dev)
{
    (void)params;
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    CHECK_DEINIT();
    lock();
    int s = slot_of(ctx);
    if (s >= 0)
        ctx_destroy(s);
    unlock();
    return s >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    CHECK_DEINIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_depth ? t_stack[t_depth - 1].h : NULL;
    return CUDA_SUCCESS;
}

/* Pushes (push != 0) or replaces the top of the stack with ctx. */
static CUresult make_current(CUcontext ctx, int push)
{
    CHECK_DEINIT();
    lock();
    int s = slot_of(ctx);
    if (s < 0 && push && was_a_context(ctx)) {
        t_pushed_dead = 1;
        return unlock_ret(CUDA_SUCCESS);
    }
    if (s < 0) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
    if (push && t_depth == STACK_DEPTH) return unlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
    if (!push && t_depth > 0) t_depth--;
    push_current(s);
    return unlock_ret(CUDA_SUCCESS);
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    CHECK_DEINIT();
    if (!ctx) { /* NULL pops, as documented */
        if (t_depth > 0) t_depth--;
        return CUDA_SUCCESS;
    }
    return make_current(ctx, 0);
}

static void (*g_push_hook)(void *);
static void *g_push_hook_arg;

/* Runs (once) what fakecuda_on_next_push armed, unlocked, as if another
 * thread had run it just before this push. */
static void run_push_hook(void)
{
    lock();
    void (*fn)(void *) = g_push_hook;
    void *arg = g_push_hook_arg;
    g_push_hook = NULL;
    unlock();
    if (fn) fn(arg);
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    run_push_hook();
    return make_current(ctx, 1);
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CHECK_DEINIT();
    if (t_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    t_depth--;
    if (pctx) *pctx = t_stack[t_depth].h;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

/* The current context's id, as documented for a NULL context, without the
 * lock: like cuCtxGetCurrent a thread-local read (the library asks it on
 * every open and close). Ids are unique for the life of the process, so a
 * context born at a dead one's address has another. */
static CUresult current_id(unsigned long long *id)
{
    const struct tls_entry *e = t_depth ? &t_stack[t_depth - 1] : NULL;
    int s = e ? slot_of(e->h) : -1;
    if (s < 0 || __atomic_load_n(&g_ctx[s].id, __ATOMIC_RELAXED) != e->id)
        return no_current_error();
    *id = e->id;
    return CUDA_SUCCESS;
}

/* A destroyed context's pointer (created, or a reset or released primary):
 * CONTEXT_IS_DESTROYED, as the real driver answers (tests/gpu/ctx_ids.c);
 * anything else: INVALID_CONTEXT. */
static CUresult ctx_get_id(CUcontext ctx, unsigned long long *id)
{
    CHECK_DEINIT();
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) return current_id(id);
    lock();
    int s = slot_of(ctx);
    if (s >= 0) *id = g_ctx[s].id;
    int destroyed = s < 0 && was_a_context(ctx);
    unlock();
    if (destroyed) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return s >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* A pre-12.0 driver has no cuCtxGetId at all. With FAKECUDA_NO_CTXGETID=1 the
 * exported name is an indirect function whose resolver finds nothing, so
 * dlsym returns NULL for it, as on such a driver (the resolver runs at each
 * lookup, so the setting may change before the first one). */
typedef CUresult (*ctx_get_id_fn)(CUcontext, unsigned long long *);
static ctx_get_id_fn find_ctx_get_id(void)
{
    return no_ctxgetid() ? NULL : ctx_get_id;
}
CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *id)
    __attribute__((ifunc("find_ctx_get_id")));

CUresult CUDAAPI cuCtxGetDevice(CUdevice *dev)
{
    CHECK_DEINIT();
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    lock();
    int s = current_slot();
    if (s >= 0) *dev = g_ctx[s].dev;
    unlock();
    return s >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- primary contexts ---- */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CHECK_DEINIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    struct fprimary *p = &g_primary[dev];
    if (!p->active) {
        int s = ctx_alloc(dev, p->flags, 1);
        if (s < 0) return unlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
        p->active = 1;
        p->slot = s;
    }
    p->refs++;
    *pctx = handle_of(p->slot); /* not made current, as documented */
    return unlock_ret(CUDA_SUCCESS);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CHECK_DEINIT();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    struct fprimary *p = &g_primary[dev];
    CUresult rc = p->active ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    if (p->active && --p->refs == 0)
        ctx_destroy(p->slot);
    unlock();
    return rc;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CHECK_DEINIT();
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    if (g_primary[dev].active)
        ctx_destroy(g_primary[dev].slot);
    unlock();
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CHECK_DEINIT();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
    lock();
    *flags = g_primary[dev].flags;
    *active = g_primary[dev].active;
    unlock();
    return CUDA_SUCCESS;
}

/* ---- allocations ---- */

static CUdeviceptr alloc_addr(int i) { return ALLOC_BASE + (CUdeviceptr)i * ALLOC_STRIDE; }

/* Index of the live allocation containing dptr (exact base if base_only). */
static int alloc_find(CUdeviceptr dptr, int base_only)
{
    if (dptr < ALLOC_BASE) return -1;
    CUdeviceptr i = (dptr - ALLOC_BASE) / ALLOC_STRIDE;
    if (i >= MAX_ALLOCS || !g_alloc[i].used) return -1;
    CUdeviceptr off = dptr - alloc_addr((int)i);
    if (base_only ? off != 0 : off >= g_alloc[i].size) return -1;
    return (int)i;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    CHECK_DEINIT();
    if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    int s = current_slot();
    if (s < 0) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
    for (int i = 0; i < MAX_ALLOCS && bytes <= ALLOC_STRIDE; i++) {
        if (!g_alloc[i].used) {
            /* A fresh serial even when the address is reused. */
            g_alloc[i] = (struct falloc){1, s, bytes, g_next_serial++, g_ctx[s].id};
            *dptr = alloc_addr(i);
            phys_note_alloc(g_alloc[i].serial, bytes);
            return unlock_ret(CUDA_SUCCESS);
        }
    }
    return unlock_ret(CUDA_ERROR_OUT_OF_MEMORY);
}

/* FAKECUDA_SLOW_FREE_MS above 0: a free waits that long before it acts, to
 * widen the window between an exporter's last words to the ledger and the
 * real free (the measured driver's free is quick; the window is real). */
static void slow_free(void)
{
    long ms = env_long("FAKECUDA_SLOW_FREE_MS", 0);
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    while (ms > 0 && nanosleep(&t, &t) != 0)
        ;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    CHECK_DEINIT();
    slow_free();
    lock();
    int i = alloc_find(dptr, 1);
    if (i >= 0) alloc_release(i);
    unlock();
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- IPC handles and mappings ---- */

/*
 * A handle uses all 64 bytes, as a real one may, so a cache that keys on part
 * of it is caught:
 *   0-7 magic, 8-15 exporter pid, 16-23 size,
 *   24-31 a nonce, ignored for identity: 0, or one per export with
 *         FAKECUDA_HANDLE_PER_CALL=1 (two byte strings for one mapping),
 *   32-39 allocation serial, 40-63 three check words over pid, serial, size
 *         (a handle whose check words do not match is refused).
 */
static uint64_t check_word(uint64_t pid, uint64_t serial, uint64_t bytes, int i)
{
    uint64_t h = (pid * 0x9e3779b97f4a7c15ULL) ^ (serial + 0x632be59bd9b4e019ULL * (uint64_t)(i + 1)) ^
                 (bytes << (8 * i + 1));
    h ^= h >> 31;
    return h * 0xbf58476d1ce4e5b9ULL;
}

static void make_handle(CUipcMemHandle *out, uint64_t pid, uint64_t serial, uint64_t bytes,
                        uint64_t nonce)
{
    memcpy(out->reserved, FAKECUDA_HANDLE_MAGIC, 8);
    memcpy(out->reserved + 8, &pid, 8);
    memcpy(out->reserved + 16, &bytes, 8);
    memcpy(out->reserved + 24, &nonce, 8);
    memcpy(out->reserved + 32, &serial, 8);
    for (int i = 0; i < 3; i++) {
        uint64_t w = check_word(pid, serial, bytes, i);
        memcpy(out->reserved + 40 + 8 * i, &w, 8);
    }
}

/* Also rejects the all-zero handle, whose magic is wrong. */
static int parse_handle(const CUipcMemHandle *h, uint64_t *pid, uint64_t *serial, uint64_t *bytes)
{
    if (memcmp(h->reserved, FAKECUDA_HANDLE_MAGIC, 8) != 0) return 0;
    memcpy(pid, h->reserved + 8, 8);
    memcpy(bytes, h->reserved + 16, 8);
    memcpy(serial, h->reserved + 32, 8);
    for (int i = 0; i < 3; i++) {
        uint64_t w;
        memcpy(&w, h->reserved + 40 + 8 * i, 8);
        if (w != check_word(*pid, *serial, *bytes, i)) return 0;
    }
    return 1;
}

/* The H200's driver (580) gives one allocation the same 64 bytes at every
 * export, of its base or of a pointer inside it: so does the stand-in. With
 * FAKECUDA_HANDLE_PER_CALL=1 each export gets a nonce of its own instead, as
 * a driver may do (the library must be right under both). */
static uint64_t export_nonce(void)
{
    return env_long("FAKECUDA_HANDLE_PER_CALL", 0) == 1 ? g_next_nonce++ : 0;
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr)
{
    CHECK_DEINIT();
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    lock();
    int i = alloc_find(dptr, 0); /* a pointer inside: the allocation's handle */
    if (i >= 0)
        make_handle(h, (uint64_t)getpid(), g_alloc[i].serial, g_alloc[i].size, export_nonce());
    unlock();
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static struct fmap *map_of_alloc(int s, uint64_t pid, uint64_t serial)
{
    for (size_t i = 0; i < g_nmaps; i++)
        if (g_maps[i].ctx == s && g_maps[i].pid == pid && g_maps[i].serial == serial)
            return &g_maps[i];
    return NULL;
}

/* Index of the mapping in context s containing dptr (exact base if base_only). */
static long map_find(int s, CUdeviceptr dptr, int base_only)
{
    for (size_t i = 0; i < g_nmaps; i++) {
        struct fmap *m = &g_maps[i];
        size_t span = m->size ? m->size : 1;
        if (m->ctx == s && (base_only ? dptr == m->addr : dptr - m->addr < span)) return (long)i;
    }
    return -1;
}

/* Deterministic per serial; probes on past a clash inside the context. */
static CUdeviceptr pick_addr(int s, uint64_t serial)
{
    CUdeviceptr a = IPC_BASE + serial * IPC_STRIDE;
    while (a == 0 || map_find(s, a, 1) >= 0)
        a += IPC_STRIDE;
    return a;
}

/* The driver lets the handles of one exporting process be open in only one
 * context per device of the importing process (cuIpcOpenMemHandle's docs;
 * measured on H200: CUDA_ERROR_INVALID_HANDLE). */
static int exporter_open_elsewhere(int s, uint64_t pid)
{
    for (size_t i = 0; i < g_nmaps; i++)
        if (g_maps[i].pid == pid && g_maps[i].ctx != s &&
            g_ctx[g_maps[i].ctx].dev == g_ctx[s].dev)
            return 1;
    return 0;
}

static CUresult add_map(int s, uint64_t pid, uint64_t serial, uint64_t bytes, CUdeviceptr *out)
{
    if (exporter_open_elsewhere(s, pid) || phys_exporter_exited(pid, serial))
        return CUDA_ERROR_INVALID_HANDLE;
    if (g_nmaps == g_capmaps) {
        size_t cap = g_capmaps ? 2 * g_capmaps : 64;
        struct fmap *n = realloc(g_maps, cap * sizeof *n);
        if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
        g_maps = n;
        g_capmaps = cap;
    }
    CUdeviceptr a = pick_addr(s, serial);
    g_maps[g_nmaps++] = (struct fmap){s, pid, serial, a, (size_t)bytes, 1};
    phys_note_map(pid, serial, +1);
    g_cnt.maps++;
    g_cnt.live_mappings++;
    *out = a;
    return CUDA_SUCCESS;
}

/* Lock held.  Returns 1 with *rc set if the handle is already mapped (or
 * the open cannot proceed), 0 if the caller must map it. */
static int open_precheck(int s, unsigned long long ctx_id, uint64_t pid, uint64_t serial,
                         CUdeviceptr *pdptr, CUresult *rc)
{
    struct fmap *m;
    if (is_deinit()) {
        *rc = CUDA_ERROR_DEINITIALIZED;
    } else if (!g_ctx[s].used || g_ctx[s].id != ctx_id) { /* destroyed meanwhile */
        *rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if ((m = map_of_alloc(s, pid, serial)) != NULL) {
        m->refs++;
        *pdptr = m->addr;
        *rc = CUDA_SUCCESS;
    } else {
        return 0;
    }
    return 1;
}

/* Lock held; may drop it while "mapping".  Refcounts an existing mapping
 * of the allocation in context s, or creates one. */
static CUresult map_or_ref(int s, uint64_t pid, uint64_t serial, uint64_t bytes,
                           CUdeviceptr *pdptr)
{
    unsigned long long ctx_id = g_ctx[s].id;
    CUresult rc;
    if (open_precheck(s, ctx_id, pid, serial, pdptr, &rc)) return rc;
    long delay = env_long("FAKECUDA_OPEN_DELAY_US", 0);
    if (delay > 0) {
        /* A slow map must not stall other threads' driver calls, so sleep
         * unlocked, then re-check: the world may have moved on meanwhile. */
        unlock();
        usleep((useconds_t)delay);
        lock();
        if (open_precheck(s, ctx_id, pid, serial, pdptr, &rc)) return rc;
    }
    return add_map(s, pid, serial, bytes, pdptr);
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags)
{
    uint64_t pid, serial, bytes;
    lock();
    g_cnt.open_calls++;
    int s = current_slot();
    if (is_deinit()) return unlock_ret(CUDA_ERROR_DEINITIALIZED);
    if (s < 0) return unlock_ret(no_current_error());
    if (!pdptr || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS ||
        !parse_handle(&h, &pid, &serial, &bytes))
        return unlock_ret(CUDA_ERROR_INVALID_VALUE);
    if (pid == (uint64_t)getpid()) /* the driver refuses one's own exports */
        return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
    CUresult rc = map_or_ref(s, pid, serial, bytes, pdptr);
    unlock();
    long delay = env_long("FAKECUDA_REFUSED_OPEN_DELAY_US", 0);
    if (rc == CUDA_ERROR_INVALID_HANDLE && delay > 0)
        usleep((useconds_t)delay); /* the refusal may come late in a slow open */
    return rc;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags)
{
    return ipc_open(pdptr, h, flags);
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags)
{
    return ipc_open(pdptr, h, flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    lock();
    g_cnt.close_calls++;
    int s = current_slot();
    if (is_deinit()) return unlock_ret(CUDA_ERROR_DEINITIALIZED);
    if (capture_forbids_unsafe_calls()) return unlock_ret(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    if (s < 0) return unlock_ret(no_current_error());
    long i = map_find(s, dptr, 1);
    if (i < 0) return unlock_ret(CUDA_ERROR_INVALID_VALUE); /* incl. double close */
    long delay = env_long("FAKECUDA_CLOSE_DELAY_US", 0);
    if (delay > 0) {
        /* A slow unmap (the real one takes milliseconds): the mapping stays
         * until it is done, other threads' calls go on meanwhile. */
        unlock();
        usleep((useconds_t)delay);
        lock();
        i = map_find(s, dptr, 1);
        if (i < 0) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
    }
    if (--g_maps[i].refs == 0) {
        remove_map((size_t)i);
        g_cnt.unmaps++;
    }
    return unlock_ret(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CHECK_DEINIT();
    lock();
    int s = current_slot();
    if (s < 0) return unlock_ret(CUDA_ERROR_INVALID_CONTEXT);
    long m = map_find(s, dptr, 0);
    int a = alloc_find(dptr, 0);
    if (m < 0 && a < 0) return unlock_ret(CUDA_ERROR_INVALID_VALUE);
    if (pbase) *pbase = m >= 0 ? g_maps[m].addr : alloc_addr(a);
    if (psize) *psize = m >= 0 ? g_maps[m].size : g_alloc[a].size;
    return unlock_ret(CUDA_SUCCESS);
}

CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    return cuMemGetAddressRange_v2(pbase, psize, dptr);
}

/* ---- cuGetProcAddress ---- */

#define SYM(name, ver, fn) {name, ver, (void *)fn}
static const struct {
    const char *name;
    int version; /* driver version that introduced this ABI */
    void *fn;
} g_syms[] = {
    SYM("cuInit", 2000, cuInit),
    SYM("cuDriverGetVersion", 2000, cuDriverGetVersion),
    SYM("cuDeviceGet", 2000, cuDeviceGet),
    SYM("cuDeviceGetCount", 2000, cuDeviceGetCount),
    SYM("cuGetErrorString", 2000, cuGetErrorString),
    SYM("cuGetErrorName", 2000, cuGetErrorName),
    SYM("cuCtxCreate", 2000, cuCtxCreate),
    SYM("cuCtxCreate", 3020, cuCtxCreate_v2),
    SYM("cuCtxDestroy", 2000, cuCtxDestroy),
    SYM("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    SYM("cuCtxGetCurrent", 2000, cuCtxGetCurrent),
    SYM("cuCtxSetCurrent", 2000, cuCtxSetCurrent),
    SYM("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    SYM("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    SYM("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    SYM("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    SYM("cuCtxGetId", 12000, ctx_get_id),
    SYM("cuCtxGetDevice", 2000, cuCtxGetDevice),
    SYM("cuDevicePrimaryCtxRetain", 2000, cuDevicePrimaryCtxRetain),
    SYM("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    SYM("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    SYM("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    SYM("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    SYM("cuDevicePrimaryCtxGetState", 2000, cuDevicePrimaryCtxGetState),
    SYM("cuMemAlloc", 3020, cuMemAlloc_v2),
    SYM("cuMemFree", 3020, cuMemFree_v2),
    SYM("cuMemGetAddressRange", 2000, cuMemGetAddressRange),
    SYM("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    SYM("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    SYM("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle),
    SYM("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    SYM("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    SYM("cuGetProcAddress", 11030, cuGetProcAddress),
    SYM("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

/* Works before cuInit, as in the real driver. */
CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    lock();
    g_cnt.resolver_calls++;
    unlock();
    CHECK_DEINIT();
    /* Arguments are checked before anything is written: on these errors
     * *pfn keeps whatever the caller had there. */
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    if (flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM || version > driver_version())
        return CUDA_ERROR_INVALID_VALUE;
    int known = 0, best = -1;
    for (int i = 0; i < (int)(sizeof g_syms / sizeof g_syms[0]); i++) {
        if (strcmp(g_syms[i].name, symbol) != 0) continue;
        known = 1;
        if (g_syms[i].version <= version && (best < 0 || g_syms[i].version > g_syms[best].version))
            best = i;
    }
    void *vmm = known ? NULL : fakevmm_proc(symbol, version, &known); /* fake_vmm.c */
    if (no_ctxgetid() && strcmp(symbol, "cuCtxGetId") == 0)
        known = 0, best = -1; /* a pre-12.0 driver never heard of it */
    CUdriverProcAddressQueryResult st = !known ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                                        : best < 0 ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                                   : CU_GET_PROC_ADDRESS_SUCCESS;
    *pfn = best >= 0 ? g_syms[best].fn : NULL; /* a found-nothing answer is NULL */
    if (vmm) st = CU_GET_PROC_ADDRESS_SUCCESS, *pfn = vmm;
    if (status) *status = st;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* ---- test hooks ---- */

void fakecuda_get_counters(struct fakecuda_counters *out)
{
    lock();
    *out = g_cnt;
    unlock();
}

void fakecuda_make_foreign_handle(CUipcMemHandle *out, uint64_t alloc_serial, uint64_t bytes)
{
    make_handle(out, (uint64_t)getpid() + 1, alloc_serial, bytes, 0);
}

void fakecuda_make_foreign_export(CUipcMemHandle *out, uint64_t alloc_serial, uint64_t bytes,
                                  uint64_t nonce)
{
    make_handle(out, (uint64_t)getpid() + 1, alloc_serial, bytes, nonce);
}

void fakecuda_make_export_by(CUipcMemHandle *out, uint64_t exporter_pid, uint64_t alloc_serial,
                             uint64_t bytes, uint64_t nonce)
{
    make_handle(out, exporter_pid, alloc_serial, bytes, nonce);
}

int fakecuda_refcount(CUcontext ctx, CUdeviceptr dptr)
{
    lock();
    int s = ctx ? slot_of(ctx) : current_slot();
    long i = s >= 0 ? map_find(s, dptr, 1) : -1;
    int refs = i >= 0 ? g_maps[i].refs : 0;
    unlock();
    return refs;
}

void fakecuda_on_next_push(void (*fn)(void *arg), void *arg)
{
    lock();
    g_push_hook = fn;
    g_push_hook_arg = arg;
    unlock();
}

CUresult fakecuda_ipc_open_direct(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags)
{
    return ipc_open(pdptr, h, flags);
}

CUresult fakecuda_ipc_close_direct(CUdeviceptr dptr) { return cuIpcCloseMemHandle(dptr); }

/* Bound inside the stand-in (-Bsymbolic-functions): no interposer sees these. */
CUresult fakecuda_ctx_destroy_direct(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

CUresult fakecuda_primary_reset_direct(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

void fakecuda_deinit(void) { __atomic_store_n(&g_deinit, 1, __ATOMIC_RELEASE); }

const char *fakecuda_handle_magic(void) { return FAKECUDA_HANDLE_MAGIC; }

/* Runs at unload, after the process's atexit handlers, so the line shows
 * what was left mapped when everything else had finished. */
__attribute__((destructor)) static void write_counters_at_exit(void)
{
    const char *path = getenv("FAKECUDA_COUNTERS_AT_EXIT");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (!f) return;
    struct fakecuda_counters c;
    fakecuda_get_counters(&c);
    fprintf(f, "maps=%" PRIu64 " unmaps=%" PRIu64 " teardown_unmaps=%" PRIu64
            " open_calls=%" PRIu64 " close_calls=%" PRIu64 " live=%" PRId64 "\n",
            c.maps, c.unmaps, c.teardown_unmaps, c.open_calls, c.close_calls, c.live_mappings);
    fclose(f);
}

/* ==== "physical" memory, across processes ===========================
 *
 * What the driver does with an exported allocation's memory: it stays
 * allocated until its owner has freed it (or exited) AND no process maps it
 * any more. Each process has its own stand-in, so the book is kept in a small
 * file shared by every process of a test, FAKECUDA_PHYS_DIR/phys, changed
 * under an exclusive lock. Off (and free) when the variable is unset.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>

/* Room for a soak's fleet (tests/soak/); a full table is swept of what no
 * live process allocates or maps before it is given up on. */
#define PHYS_ALLOCS 8192
#define PHYS_HOLDERS 16384

struct phys_alloc { int64_t owner; uint64_t serial, bytes; int32_t used, freed; };
/* One process's mappings of one allocation, in all its contexts. */
struct phys_holder { int64_t holder, owner; uint64_t serial; int64_t count; };
struct phys_book {
    struct phys_alloc allocs[PHYS_ALLOCS];
    struct phys_holder holders[PHYS_HOLDERS];
};

static struct { pid_t pid; int fd; struct phys_book *book; } g_phys = { 0, -1, NULL };

/* A flock keeps processes apart, not the threads of one (they share its open
 * file description): a legacy update (under g_lock) and a VMM one (under the
 * VMM lock) would change the book at once. This mutex keeps them apart. */
static pthread_mutex_t g_phys_threads = PTHREAD_MUTEX_INITIALIZER;

/* A fork child is one thread, none of them inside the book: the mutex as a
 * parent's thread held it at the fork means nothing there. */
static void phys_forked(void)
{
    pthread_mutex_init(&g_phys_threads, NULL);
}

__attribute__((constructor)) static void phys_init(void)
{
    pthread_atfork(NULL, NULL, phys_forked);
}

static struct phys_book *phys_open(const char *dir);

static struct phys_book *phys_lock(void)
{
    const char *dir = getenv("FAKECUDA_PHYS_DIR");
    if (!dir || !*dir) return NULL;
    pthread_mutex_lock(&g_phys_threads);
    struct phys_book *b = phys_open(dir);
    /* A signal handler without SA_RESTART (the library's stats signal's)
     * fails a waiting flock with EINTR: the update must still happen, as
     * the driver's own bookkeeping does not skip a change on a signal. */
    while (b && flock(g_phys.fd, LOCK_EX) != 0)
        if (errno != EINTR) b = NULL;
    if (!b) pthread_mutex_unlock(&g_phys_threads);
    return b;
}

static void phys_unlock(void)
{
    flock(g_phys.fd, LOCK_UN);
    pthread_mutex_unlock(&g_phys_threads);
}

/* Opened per process: a lock held through a descriptor shared with a fork
 * parent would not keep the two apart. */
static struct phys_book *phys_open(const char *dir)
{
    if (g_phys.pid != getpid()) {
        char path[1024];
        snprintf(path, sizeof path, "%s/phys", dir);
        if (g_phys.book) munmap(g_phys.book, sizeof *g_phys.book);
        if (g_phys.fd >= 0) close(g_phys.fd);
        g_phys.book = NULL;
        g_phys.pid = getpid();
        g_phys.fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (g_phys.fd < 0 || ftruncate(g_phys.fd, sizeof *g_phys.book) != 0) return NULL;
        void *m = mmap(NULL, sizeof *g_phys.book, PROT_READ | PROT_WRITE, MAP_SHARED, g_phys.fd, 0);
        g_phys.book = m == MAP_FAILED ? NULL : m;
    }
    return g_phys.book;
}

static int phys_alive(int64_t pid);
int fakecuda_process_runs(int64_t pid)
{
    return phys_alive(pid);
}

static int phys_mapped(const struct phys_book *b, const struct phys_alloc *a);

/* Freed by its owner, or its owner exited. */
static int phys_gone(const struct phys_alloc *a)
{
    return a->freed || !phys_alive(a->owner);
}

/* Frees the rows that no longer count: holders that exited, allocations
 * freed (or whose owner exited) that no live process maps. Only when a
 * table is full, so that a long run's rows are reused. */
static void phys_sweep(struct phys_book *b)
{
    for (int i = 0; i < PHYS_HOLDERS; i++)
        if (b->holders[i].count > 0 && !phys_alive(b->holders[i].holder))
            b->holders[i].count = 0;
    for (int i = 0; i < PHYS_ALLOCS; i++) {
        struct phys_alloc *a = &b->allocs[i];
        if (a->used && phys_gone(a) && !phys_mapped(b, a))
            a->used = 0;
    }
}

static void phys_note_alloc(uint64_t serial, uint64_t bytes)
{
    struct phys_book *b = phys_lock();
    if (!b) return;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < PHYS_ALLOCS; i++) {
            if (!b->allocs[i].used) {
                b->allocs[i] = (struct phys_alloc){g_phys.pid, serial, bytes, 1, 0};
                phys_unlock();
                return;
            }
        }
        phys_sweep(b);
    }
    phys_unlock();
}

static void phys_note_free(uint64_t serial)
{
    struct phys_book *b = phys_lock();
    if (!b) return;
    int64_t me = g_phys.pid; /* getpid() is a system call: not once per row */
    for (int i = 0; i < PHYS_ALLOCS; i++)
        if (b->allocs[i].used && b->allocs[i].owner == me && b->allocs[i].serial == serial)
            b->allocs[i].freed = 1;
    phys_unlock();
}

/* This process maps (delta +1) or unmaps (-1) the allocation (owner, serial). */
static void phys_note_map(uint64_t owner, uint64_t serial, int delta)
{
    struct phys_book *b = phys_lock();
    if (!b) return;
    struct phys_holder *h = NULL, *empty = NULL;
    int64_t me = g_phys.pid; /* getpid() is a system call: not once per row */
    for (int i = 0; i < PHYS_HOLDERS && !h; i++) {
        struct phys_holder *x = &b->holders[i];
        if (x->count > 0 && x->holder == me && x->owner == (int64_t)owner && x->serial == serial)
            h = x;
        else if (x->count <= 0 && !empty)
            empty = x;
    }
    if (!h && delta > 0 && !empty) {
        phys_sweep(b);
        for (int i = 0; i < PHYS_HOLDERS && !empty; i++)
            if (b->holders[i].count <= 0) empty = &b->holders[i];
    }
    long delay = env_long("FAKECUDA_PHYS_NOTE_DELAY_US", 0);
    if (delay > 0)
        usleep((useconds_t)delay); /* a test's: widens what another thread may do meanwhile */
    if (!h && delta > 0 && empty)
        *(h = empty) = (struct phys_holder){me, (int64_t)owner, serial, 0};
    if (h) h->count += delta; /* a fork child unmapping its parent's: no record */
    phys_unlock();
}

/* Whether the book lists the allocation (owner, serial) and its owner has
 * exited (a zombie included). The driver then refuses to map its handle
 * (CUDA_ERROR_INVALID_HANDLE) in a process that does not map it already,
 * even while another process keeps the memory (H200, driver 580:
 * tests/gpu/exporter_exit.c). Without the book (FAKECUDA_PHYS_DIR unset) the
 * stand-in cannot tell an exporter's handle from one a test made up, and
 * maps it: more lenient than the driver there. */
static int phys_exporter_exited(uint64_t owner, uint64_t serial)
{
    struct phys_book *b = phys_lock();
    if (!b) return 0;
    int listed = 0;
    for (int i = 0; i < PHYS_ALLOCS && !listed; i++)
        listed = b->allocs[i].used && b->allocs[i].owner == (int64_t)owner &&
                 b->allocs[i].serial == serial;
    phys_unlock();
    return listed && !phys_alive((int64_t)owner);
}

/* A process that has exited (a zombie included) holds nothing. */
static int phys_alive(int64_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static int phys_mapped(const struct phys_book *b, const struct phys_alloc *a)
{
    for (int i = 0; i < PHYS_HOLDERS; i++) {
        const struct phys_holder *h = &b->holders[i];
        if (h->count > 0 && h->owner == a->owner && h->serial == a->serial && phys_alive(h->holder))
            return 1;
    }
    return 0;
}

/* Bytes of every allocation of the test still physically allocated. */
uint64_t fakecuda_phys_bytes(void)
{
    struct phys_book *b = phys_lock();
    if (!b) return 0;
    uint64_t total = 0;
    for (int i = 0; i < PHYS_ALLOCS; i++) {
        const struct phys_alloc *a = &b->allocs[i];
        if (a->used && (!phys_gone(a) || phys_mapped(b, a)))
            total += a->bytes;
    }
    phys_unlock();
    return total;
}

/* What the process pid maps (or holds imported) of the allocations in the
 * book, in one look: every one, and of those the ones whose owner freed
 * them or exited. */
void fakecuda_phys_held(int64_t pid, struct fakecuda_held *out)
{
    struct phys_book *b = phys_lock();
    *out = (struct fakecuda_held){0};
    for (int i = 0; b && i < PHYS_HOLDERS; i++) {
        const struct phys_holder *h = &b->holders[i];
        for (int j = 0; h->count > 0 && h->holder == pid && j < PHYS_ALLOCS; j++) {
            const struct phys_alloc *a = &b->allocs[j];
            if (a->used && a->owner == h->owner && a->serial == h->serial) {
                out->bytes += a->bytes;
                out->allocs++;
                out->ghost_bytes += phys_gone(a) ? a->bytes : 0;
                break;
            }
        }
    }
    if (b) phys_unlock();
}

/* Freed (or of an owner that exited) and still mapped by a live process. */
static int phys_ghost(const struct phys_book *b, const struct phys_alloc *a)
{
    return a->used && phys_gone(a) && phys_mapped(b, a);
}

/* Each allocation freed (or of an owner that exited) that a live process
 * still maps, once. */
uint64_t fakecuda_phys_ghost_total(void)
{
    struct phys_book *b = phys_lock();
    if (!b) return 0;
    uint64_t total = 0;
    for (int i = 0; i < PHYS_ALLOCS; i++) {
        const struct phys_alloc *a = &b->allocs[i];
        if (phys_ghost(b, a))
            total += a->bytes;
    }
    phys_unlock();
    return total;
}

/* The VMM model's allocations (fake_vmm.c) are booked here too. */
__attribute__((visibility("hidden"))) void fakecuda_phys_alloc(uint64_t serial, uint64_t bytes)
{
    phys_note_alloc(serial, bytes);
}

__attribute__((visibility("hidden"))) void fakecuda_phys_free(uint64_t serial)
{
    phys_note_free(serial);
}

__attribute__((visibility("hidden"))) void fakecuda_phys_hold(uint64_t owner, uint64_t serial,
                                                              int delta)
{
    phys_note_map(owner, serial, delta);
}

/* ---- stream capture in global mode ----
 * FAKECUDA_GLOBAL_CAPTURE=1 plays a thread of the process capturing a CUDA
 * graph in global mode: every other thread's potentially unsafe call (an IPC
 * close among them) then fails, unless that thread switched itself to the
 * relaxed mode. */
static __thread CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CHECK_DEINIT();
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static int capture_forbids_unsafe_calls(void)
{
    return env_long("FAKECUDA_GLOBAL_CAPTURE", 0) == 1 &&
           t_capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED;
}

/* ---- the differential fuzzer's view (tests/fuzz/fuzz.c) ---- */

/* Lists every live mapping (at most cap) and returns how many exist. The
 * context is named by its creation serial, which never repeats, so a caller
 * can name contexts without depending on reused addresses. */
size_t fakecuda_list_mappings(struct fakecuda_mapping *out, size_t cap)
{
    lock();
    size_t n = g_nmaps;
    for (size_t i = 0; i < n && i < cap; i++) {
        const struct fmap *m = &g_maps[i];
        out[i] = (struct fakecuda_mapping){g_ctx[m->ctx].id, m->pid, m->serial, m->refs};
    }
    unlock();
    return n;
}

int fakecuda_allocation_serial(CUdeviceptr dptr, uint64_t *serial)
{
    lock();
    int i = alloc_find(dptr, 0);
    if (i >= 0) *serial = g_alloc[i].serial;
    unlock();
    return i >= 0;
}

int fakecuda_ipc_allocation_at(CUdeviceptr ptr, uint64_t *pid, uint64_t *serial)
{
    lock();
    int s = current_slot();
    long i = s >= 0 ? map_find(s, ptr, 0) : -1;
    if (i >= 0) {
        *pid = g_maps[i].pid;
        *serial = g_maps[i].serial;
    }
    unlock();
    return i >= 0;
}

unsigned long long fakecuda_ctx_serial(CUcontext ctx)
{
    lock();
    int s = slot_of(ctx);
    unsigned long long id = s >= 0 ? g_ctx[s].id : 0;
    unlock();
    return id;
}

/* Each allocation fakecuda_phys_ghost_total counts, a line each: its owner,
 * serial, bytes, whether the owner freed it or died, and each live process
 * that maps it with its count. */
void fakecuda_phys_ghost_list(FILE *out)
{
    struct phys_book *b = phys_lock();
    if (!b) return;
    for (int i = 0; i < PHYS_ALLOCS; i++) {
        const struct phys_alloc *a = &b->allocs[i];
        if (!phys_ghost(b, a)) continue;
        fprintf(out, "owner %lld serial %llu bytes %llu %s; mapped by", (long long)a->owner,
                (unsigned long long)a->serial, (unsigned long long)a->bytes, a->freed ? "freed" : "died");
        for (int j = 0; j < PHYS_HOLDERS; j++) {
            const struct phys_holder *h = &b->holders[j];
            if (h->count > 0 && h->owner == a->owner && h->serial == a->serial && phys_alive(h->holder))
                fprintf(out, " %lld (x%lld)", (long long)h->holder, (long long)h->count);
        }
        fputc('\n', out);
    }
    phys_unlock();
}
