/*
 * resolve.c - finding the real driver functions, and handing our wrappers to
 * whoever looks the hooked names up.
 *
 * Callers reach the driver three ways (see README, "How it hooks"): linked
 * symbols (the exports themselves), dlsym on libcuda (cudart, ctypes), and
 * cuGetProcAddress (cudart after it found the resolver, cuda-python). The
 * last two land here: the real lookup runs first with the caller's arguments,
 * and only a successful answer for a hooked name is replaced by our wrapper.
 *
 * The exported dlsym is an assembly trampoline (dlsym_<arch>.S): it asks
 * ipcc_dlsym_hook() for a wrapper and otherwise jumps - not calls - to the
 * real dlsym, so glibc still sees the original caller's return address and
 * RTLD_NEXT keeps its meaning for every other library.
 *
 * Other interposers of the same names sit before or after us in the load
 * order; calls must go down that chain once, never back up. So a lookup is
 * answered with our wrapper only when the real answer lies below us (the
 * driver, or an interposer loaded after us), and never for an interposer
 * below us looking for its own next function. The real functions we keep
 * are all below us, and their libraries are pinned: we call them up to exit.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void *(*ipcc_real_dlsym)(void *, const char *);

/* The dlsym path runs inside sanitizer runtimes' own start-up (ASan looks up
 * mmap with dlsym before its shadow memory exists), so it is never
 * instrumented. */
#define NOT_SANITIZED __attribute__((no_sanitize("address", "undefined", "thread")))

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static struct ipcc_driver driver;

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
NOT_SANITIZED static void ensure_real_dlsym(void)
{
    if (__builtin_expect(__atomic_load_n(&ipcc_real_dlsym, __ATOMIC_ACQUIRE) == NULL, 0))
        find_real_dlsym();
}

/* ---- the hook table ----------------------------------------------------- */

NOT_SANITIZED static struct ipcc_hook *hook_by_symbol(const char *symbol)
{
    /* Every hooked name starts with "cu": most lookups stop here. */
    if (symbol[0] != 'c' || symbol[1] != 'u')
        return NULL;
    for (int i = 0; i < IPCC_SLOT_COUNT; i++)
        if (strcmp(ipcc_hooks[i].symbol, symbol) == 0)
            return &ipcc_hooks[i];
    return NULL;
}

/* The row cuGetProcAddress(proc_name, version) selects: the newest ABI
 * introduced at or before that version, as the driver itself chooses. */
static struct ipcc_hook *hook_by_proc(const char *proc_name, int version)
{
    struct ipcc_hook *best = NULL;
    if (proc_name[0] != 'c' || proc_name[1] != 'u')
        return NULL;
    for (int i = 0; i < IPCC_SLOT_COUNT; i++) {
        struct ipcc_hook *h = &ipcc_hooks[i];
        if (strcmp(h->proc_name, proc_name) == 0 && h->since <= version &&
            (!best || h->since > best->since))
            best = h;
    }
    return best;
}

/* ---- where a library sits in the load order ----------------------------- */

/* The loaded object that holds addr; NULL if none does. */
NOT_SANITIZED static struct link_map *object_of(const void *addr)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (!addr || !dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP))
        return NULL;
    return map;
}

struct load_order {
    ElfW(Addr) self, target; /* load addresses: one object each */
    int seen_self, below;
};

NOT_SANITIZED static int visit_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct load_order *o = arg;
    (void)size;
    if (info->dlpi_addr == o->self) {
        o->seen_self = 1;
    } else if (info->dlpi_addr == o->target) {
        o->below = o->seen_self;
        return 1;
    }
    return 0;
}

/* 1 if addr lies in an object loaded after this library: one that RTLD_NEXT
 * from us can reach, or the driver dlopened later. Preloads load in their
 * LD_PRELOAD order, before the program's own libraries. dl_iterate_phdr
 * walks the objects in load order under the loader's lock. */
NOT_SANITIZED static int below_us(const void *addr)
{
    struct link_map *target = object_of(addr), *self = object_of((const void *)object_of);
    if (!target || !self || target == self)
        return 0;
    struct load_order o = { self->l_addr, target->l_addr, 0, 0 };
    dl_iterate_phdr(visit_object, &o);
    return o.below;
}

/* 1 if the caller is an interposer of `name` below us, looking for its own
 * next function (through the driver's handle, say): it must get the real
 * answer, or it would call us and we it. */
NOT_SANITIZED static int asked_by_interposer_below(const void *caller, const char *name)
{
    if (!below_us(caller))
        return 0;
    struct link_map *m = object_of(caller);
    void *h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *own = ipcc_real_dlsym(h, name); /* its own definition comes first */
    dlclose(h);
    return own && object_of(own) == m;
}

/* Keeps the library holding fn loaded for good: we call through pointers
 * into it up to exit, after the program may have dlclosed it. */
NOT_SANITIZED static void pin(void *fn)
{
    struct link_map *m = object_of(fn);
    if (!m || !m->l_name[0])
        return; /* the program itself */
    void *h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    if (h)
        dlclose(h); /* drops the reference; RTLD_NODELETE stays */
}

/* Remembers the first real function seen for a row. Any later one the driver
 * hands out for the same row has the same ABI, so the first stays. */
NOT_SANITIZED static void remember_real(struct ipcc_hook *h, void *real)
{
    void *expected = NULL;
    if (real && real != h->wrapper && atomic_compare_exchange_strong(&h->real, &expected, real))
        pin(real);
}

/* A handle on the loaded driver without loading anything: the library that
 * holds a real function we already know, else whatever libcuda.so.1 is. */
static void *driver_handle(void)
{
    for (int i = 0; i < IPCC_SLOT_COUNT; i++) {
        Dl_info info;
        void *real = atomic_load(&ipcc_hooks[i].real);
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
    ensure_real_dlsym();
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
    struct ipcc_hook *h = &ipcc_hooks[slot];
    void *real = atomic_load_explicit(&h->real, memory_order_acquire);
    if (real)
        return real;
    remember_real(h, find_in_driver(h->symbol));
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

/* ---- substitution ------------------------------------------------------- */

/* Given what the real resolver returned for (symbol, version), returns the
 * pointer the caller should get: our wrapper for a hooked name, else real -
 * also for an interposer below us that looks its next function up here. */
void *ipcc_resolve_substitute(const char *symbol, int version, void *real, const void *caller)
{
    if (!symbol || !real || ipcc_config_disabled_early())
        return real;
    struct ipcc_hook *h = hook_by_proc(symbol, version);
    if (!h || asked_by_interposer_below(caller, h->symbol))
        return real;
    remember_real(h, real);
    return h->wrapper;
}

/*
 * Called by the dlsym trampoline with the caller's return address. Returns
 * our wrapper when the caller asked for a hooked name whose real answer lies
 * below us; returns NULL to let the trampoline jump to the real dlsym, which
 * answers with the caller's own arguments, relative to the caller:
 *  - RTLD_NEXT: an interposer before us gets our export, one after us the
 *    driver. (Asked from here it would be relative to us, and hand an
 *    interposer after us our wrapper: the two would call each other.)
 *  - RTLD_DEFAULT, the program's handle: the first definition, ours or that
 *    of an interposer before us, which leads on to ours.
 *  - an interposer below us asking for its next function.
 */
NOT_SANITIZED void *ipcc_dlsym_hook(void *handle, const char *name, const void *caller)
{
    ensure_real_dlsym();
    if (!name || handle == RTLD_NEXT)
        return NULL;
    struct ipcc_hook *h = hook_by_symbol(name);
    if (!h || ipcc_config_disabled_early())
        return NULL;
    void *real = ipcc_real_dlsym(handle, name);
    if (!real || !below_us(real) || asked_by_interposer_below(caller, name))
        return NULL;
    remember_real(h, real);
    return h->wrapper;
}
