/*
 * driver.c - the real driver: its functions behind each hooked row, found
 * past ourselves and pinned, and the few the cache calls itself. The basics
 * every layer calls; the hook table is the entry layer's, registered here
 * by entry/wiring.c at load (ipcc_hooks_register), so that this file needs
 * nothing above it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "driver.h"
#include "log.h"

void *(*ipcc_real_dlsym)(void *, const char *);

/* The dlsym path runs inside sanitizer runtimes' own start-up (ASan looks up
 * mmap with dlsym before its shadow memory exists), so it is never
 * instrumented. */
#define NOT_SANITIZED __attribute__((no_sanitize("address", "undefined", "thread")))

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static struct ipcc_driver driver;
static struct ipcc_hook *_Atomic hooks;

void ipcc_hooks_register(struct ipcc_hook *table)
{
    atomic_store_explicit(&hooks, table, memory_order_release);
}

NOT_SANITIZED struct ipcc_hook *ipcc_hook_table(void)
{
    return atomic_load_explicit(&hooks, memory_order_acquire);
}

/* ---- the real dlsym ----------------------------------------------------- */

/* The public dlsym is ours, and glibc >= 2.34 has no private alias: ask for
 * the next definition by version. 2.34 first (the current one), then the
 * original version of each architecture (x86-64, aarch64) for older glibc. */
NOT_SANITIZED static void find_real_dlsym(void)
{
    static const char *const versions[] = { "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17" };
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        void *p = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (p) {
            __atomic_store_n(&ipcc_real_dlsym, (void *(*)(void *, const char *))p,
                             __ATOMIC_RELEASE);
            return;
        }
    }
    ipcc_log(IPCC_LOG_ERROR, "cannot find the C library's dlsym; aborting");
    abort();
}

/* No pthread_once here: sanitizer runtimes call dlsym while initialising
 * themselves, before their pthread interceptors can run. The lookup has no
 * side effects, so threads racing through it just store the same value. */
NOT_SANITIZED void ipcc_ensure_real_dlsym(void)
{
    if (__builtin_expect(__atomic_load_n(&ipcc_real_dlsym, __ATOMIC_ACQUIRE) == NULL, 0))
        find_real_dlsym();
}

/* The loaded object that holds addr; NULL if none does. */
NOT_SANITIZED struct link_map *ipcc_object_of(const void *addr)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (!addr || !dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP))
        return NULL;
    return map;
}

/* Keeps the library holding fn loaded for good: we call through pointers
 * into it up to exit, after the program may have dlclosed it. */
NOT_SANITIZED static void pin(void *fn)
{
    struct link_map *m = ipcc_object_of(fn);
    if (!m || !m->l_name[0])
        return; /* the program itself */
    void *h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    if (h)
        dlclose(h); /* drops the reference; RTLD_NODELETE stays */
}

/* Remembers the first real function seen for a row. Any later one the driver
 * hands out for the same row has the same ABI, so the first stays. */
NOT_SANITIZED void ipcc_remember_real(struct ipcc_hook *h, void *real)
{
    void *expected = NULL;
    if (real && real != h->wrapper && atomic_compare_exchange_strong(&h->real, &expected, real))
        pin(real);
}

/* A handle on the loaded driver without loading anything: the library that
 * holds a real function we already know, else whatever libcuda.so.1 is. */
static void *driver_handle(void)
{
    struct ipcc_hook *table = ipcc_hook_table();
    for (int i = 0; table && i < IPCC_SLOT_COUNT; i++) {
        Dl_info info;
        void *real = atomic_load(&table[i].real);
        if (real && dladdr(real, &info) && info.dli_fname) {
            void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
            if (h)
                return h;
        }
    }
    return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
}

/* Looks a driver symbol up past ourselves: first in the global scope after
 * this library, then in the driver loaded privately (cudart dlopens it
 * RTLD_LOCAL). Never through RTLD_DEFAULT, which would find our own hook. */
static void *find_in_driver(const char *symbol)
{
    ipcc_ensure_real_dlsym();
    void *p = ipcc_real_dlsym(RTLD_NEXT, symbol);
    if (p)
        return p;
    void *h = driver_handle();
    if (!h)
        return NULL;
    p = ipcc_real_dlsym(h, symbol);
    dlclose(h); /* drops only the reference NOLOAD took */
    return p;
}

/* The real function behind a hooked row, found lazily for callers that
 * reached the wrapper through a linked symbol. NULL if no driver is loaded. */
void *ipcc_real(int slot)
{
    struct ipcc_hook *table = ipcc_hook_table();
    if (!table)
        return NULL; /* before load finished: as if no driver were loaded */
    struct ipcc_hook *h = &table[slot];
    void *real = atomic_load_explicit(&h->real, memory_order_acquire);
    if (real)
        return real;
    ipcc_remember_real(h, find_in_driver(h->symbol));
    return atomic_load(&h->real);
}

/* ---- driver functions the cache itself calls ---------------------------- */

/* A driver function the cache calls itself, its library pinned. */
static void *driver_function(const char *symbol)
{
    void *fn = find_in_driver(symbol);
    pin(fn);
    return fn;
}

static void find_driver_functions(void)
{
    driver.ctx_get_current = (int (*)(void **))driver_function("cuCtxGetCurrent");
    driver.ctx_get_id = (int (*)(void *, unsigned long long *))driver_function("cuCtxGetId");
    driver.ctx_push = (int (*)(void *))driver_function("cuCtxPushCurrent_v2");
    driver.ctx_pop = (int (*)(void **))driver_function("cuCtxPopCurrent_v2");
    driver.mem_get_range =
        (int (*)(uint64_t *, size_t *, uint64_t))driver_function("cuMemGetAddressRange_v2");
    driver.thread_capture_mode =
        (int (*)(int *))driver_function("cuThreadExchangeStreamCaptureMode");
    if (!driver.ctx_get_current)
        ipcc_log(IPCC_LOG_WARN, "driver lacks cuCtxGetCurrent; caching is off");
}

static _Atomic int driver_found;

const struct ipcc_driver *ipcc_driver(void)
{
    if (__builtin_expect(!atomic_load_explicit(&driver_found, memory_order_acquire), 0)) {
        pthread_once(&driver_once, find_driver_functions);
        atomic_store_explicit(&driver_found, 1, memory_order_release);
    }
    return &driver;
}
