/*
 * ctx_ids.c - what the real driver answers about contexts that died: the
 * facts the library's context ids rest on (shim/legacy/legacy_calls.c asks
 * cuCtxGetId(NULL) on every open and close; the sweep after a primary
 * teardown and the close of another context's idle mapping still pass
 * context pointers that may be dead).
 *
 *   ctx_ids
 *
 * Plain C against cuda.h; the driver is dlopen'ed, nothing is linked, so it
 * also runs against the stand-in (LD_LIBRARY_PATH=build/tests). Prints
 * key=value lines (codes are CUresult numbers, ids the driver's); exit 0
 * when the driver could be set up and every fact the library needs holds:
 *   - a context created at a dead one's address has another id
 *     (reused_new_id=1), and so has a reset or re-created primary context
 *     (reset_new_id=1, released_new_id=1);
 *   - cuCtxGetId(NULL) answers the current context's id (null_is_current=1).
 * The other lines (what a dead pointer gets) are printed for the record.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*create)(CUcontext *, unsigned, CUdevice);
    CUresult (*destroy)(CUcontext);
    CUresult (*get_id)(CUcontext, unsigned long long *);
    CUresult (*get_current)(CUcontext *);
    CUresult (*set_current)(CUcontext);
    CUresult (*push)(CUcontext);
    CUresult (*pop)(CUcontext *);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*release)(CUdevice);
    CUresult (*reset)(CUdevice);
    CUresult (*get_state)(CUdevice, unsigned *, int *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
} cu;

static CUdevice dev;
static int facts_ok = 1;

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        printf("error=no_%s\n", name);
        exit(2);
    }
    return p;
}

static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("error=dlopen %s\n", dlerror());
        exit(2);
    }
    cu.init = sym(lib, "cuInit");
    cu.device_get = sym(lib, "cuDeviceGet");
    cu.create = sym(lib, "cuCtxCreate_v2");
    cu.destroy = sym(lib, "cuCtxDestroy_v2");
    cu.get_id = sym(lib, "cuCtxGetId");
    cu.get_current = sym(lib, "cuCtxGetCurrent");
    cu.set_current = sym(lib, "cuCtxSetCurrent");
    cu.push = sym(lib, "cuCtxPushCurrent_v2");
    cu.pop = sym(lib, "cuCtxPopCurrent_v2");
    cu.retain = sym(lib, "cuDevicePrimaryCtxRetain");
    cu.release = sym(lib, "cuDevicePrimaryCtxRelease_v2");
    cu.reset = sym(lib, "cuDevicePrimaryCtxReset_v2");
    cu.get_state = sym(lib, "cuDevicePrimaryCtxGetState");
    cu.mem_alloc = sym(lib, "cuMemAlloc_v2");
    cu.mem_free = sym(lib, "cuMemFree_v2");
    if (cu.init(0) != CUDA_SUCCESS || cu.device_get(&dev, 0) != CUDA_SUCCESS) {
        printf("error=init\n");
        exit(2);
    }
}

static void put(const char *key, long long v)
{
    printf("%s=%lld\n", key, v);
}

static void fact(const char *key, int holds)
{
    put(key, holds);
    facts_ok &= holds;
}

/* cuCtxGetId on ctx: its code under key, its id under key_id (0 on error). */
static unsigned long long ask_id(const char *key, CUcontext ctx)
{
    unsigned long long id = 0;
    char name[64];
    put(key, cu.get_id(ctx, &id));
    snprintf(name, sizeof(name), "%s_id", key);
    put(name, (long long)id);
    return id;
}

/* A created context destroyed; asked while dead; then contexts are created
 * (and destroyed) until one lands at its address, which is asked again. */
static void destroyed_then_reused(void)
{
    CUcontext dead, c = NULL;
    unsigned long long now = 0;
    cu.create(&dead, 0, dev);
    unsigned long long old = ask_id("created", dead);
    fact("null_is_current", cu.get_id(NULL, &now) == CUDA_SUCCESS && now == old);
    put("destroy", cu.destroy(dead));
    CUcontext cur = NULL;
    cu.get_current(&cur);
    put("current_after_destroy_is_dead", cur == dead);
    ask_id("current_after_destroy", NULL);
    ask_id("dead_pointer", dead);
    /* Not asked: the driver answers a push of the dead pointer with success and
     * aborts the process at the next call (H200, driver 580, 2026-12-01), so
     * the library asks a pointer's id before it pushes it (legacy_close.c). */
    int round;
    for (round = 1; round <= 16; round++) {
        if (cu.create(&c, 0, dev) != CUDA_SUCCESS || c == dead)
            break;
        cu.destroy(c);
    }
    put("reuse_rounds", round);
    put("reused_address", c == dead);
    if (c != dead)
        return;
    unsigned long long id = ask_id("reused_pointer", dead);
    fact("reused_new_id", id != 0 && id != old);
    cu.destroy(c);
}

/* This thread's current context destroyed by another thread, which then
 * creates one at its address (current there, not here). */
static CUcontext victim;
static void *destroy_elsewhere(void *arg)
{
    CUcontext *born = arg;
    put("elsewhere_destroy", cu.destroy(victim));
    for (int round = 0; round < 16; round++) {
        if (cu.create(born, 0, dev) != CUDA_SUCCESS || *born == victim)
            break;
        cu.destroy(*born);
    }
    return NULL;
}

static void destroyed_by_another_thread(void)
{
    CUcontext born = NULL, cur = NULL;
    CUdeviceptr p = 0;
    cu.create(&victim, 0, dev);
    unsigned long long old = ask_id("elsewhere_created", NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, destroy_elsewhere, &born) != 0)
        return;
    pthread_join(t, NULL);
    put("elsewhere_reused_address", born == victim);
    cu.get_current(&cur);
    put("elsewhere_current_is_dead", cur == victim);
    unsigned long long id = ask_id("elsewhere_current", NULL);
    put("elsewhere_current_id_is_old", id == old);
    CUresult rc = cu.mem_alloc(&p, 1 << 20);
    put("elsewhere_alloc", rc);
    if (rc == CUDA_SUCCESS)
        cu.mem_free(p);
    cu.set_current(NULL);
    if (born == victim)
        cu.destroy(born);
}

/* The primary context: reset while current, and released to zero. */
static void primary_teardowns(void)
{
    CUcontext p, again;
    unsigned flags;
    int active;
    cu.retain(&p, dev);
    cu.set_current(p);
    unsigned long long first = ask_id("primary", NULL);
    put("reset", cu.reset(dev));
    ask_id("reset_pointer", p);
    ask_id("reset_current", NULL);
    cu.get_state(dev, &flags, &active);
    put("reset_active", active);
    cu.retain(&again, dev); /* as cudart's next call does after cudaDeviceReset */
    put("reset_same_address", again == p);
    unsigned long long second = ask_id("reset_retained", again);
    fact("reset_new_id", second != 0 && second != first);
    /* Whether a reset kept the first retain counted is the driver's: release
     * until the primary is inactive. */
    int releases = 0;
    do
        put("release", cu.release(dev));
    while (++releases < 4 && cu.get_state(dev, &flags, &active) == CUDA_SUCCESS && active);
    put("releases_to_inactive", releases);
    cu.get_state(dev, &flags, &active);
    put("released_active", active);
    ask_id("released_pointer", p);
    cu.retain(&again, dev);
    put("released_same_address", again == p);
    unsigned long long third = ask_id("released_retained", again);
    fact("released_new_id", third != 0 && third != second && third != first);
    cu.release(dev);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    load();
    destroyed_then_reused();
    destroyed_by_another_thread();
    primary_teardowns();
    put("facts_ok", facts_ok);
    return facts_ok ? 0 : 1;
}
