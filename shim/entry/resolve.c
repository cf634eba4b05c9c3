/*
 * resolve.c - handing our wrappers to whoever looks the hooked names up.
 *
 * Callers reach the driver three ways (design.md "How it hooks"): linked
 * symbols (the exports themselves), dlsym on libcuda (cudart, ctypes), and
 * cuGetProcAddress (cudart after it found the resolver, cuda-python). The
 * last two land here: the real lookup runs first with the caller's arguments,
 * and only a successful answer for a hooked name is replaced by our wrapper.
 *
 * The real functions themselves are found by base/driver.c; the hook table
 * (entry/hooks.c) reaches both through ipcc_hooks_register().
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

#include "entry.h"

/* The dlsym path runs inside sanitizer runtimes' own start-up (ASan looks up
 * mmap with dlsym before its shadow memory exists), so it is never
 * instrumented. */
#define NOT_SANITIZED __attribute__((no_sanitize("address", "undefined", "thread")))

/* ---- the hook table ----------------------------------------------------- */

NOT_SANITIZED static struct ipcc_hook *hook_by_symbol(const char *symbol)
{
    /* Every hooked name starts with "cu": most lookups stop here. */
    struct ipcc_hook *hooks = ipcc_hook_table();
    if (symbol[0] != 'c' || symbol[1] != 'u' || !hooks)
        return NULL;
    for (int i = 0; i < IPCC_SLOT_COUNT; i++)
        if (strcmp(hooks[i].symbol, symbol) == 0)
            return &hooks[i];
    return NULL;
}

/* The row cuGetProcAddress(proc_name, version) selects: the newest ABI
 * introduced at or before that version, as the driver itself chooses. */
static struct ipcc_hook *hook_by_proc(const char *proc_name, int version)
{
    struct ipcc_hook *best = NULL, *hooks = ipcc_hook_table();
    if (proc_name[0] != 'c' || proc_name[1] != 'u' || !hooks)
        return NULL;
    for (int i = 0; i < IPCC_SLOT_COUNT; i++) {
        struct ipcc_hook *h = &hooks[i];
        if (strcmp(h->proc_name, proc_name) == 0 && h->since <= version &&
            (!best || h->since > best->since))
            best = h;
    }
    return best;
}

/* ---- where a library sits in the load order ----------------------------- */

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
    struct link_map *target = ipcc_object_of(addr), *self = ipcc_object_of((const void *)below_us);
    if (!target || !self || target == self)
        return 0;
    struct load_order o = { self->l_addr, target->l_addr, 0, 0 };
    sigset_t saved;
    ipcc_fork_guard_enter(&saved); /* its lock is one a fork copies held */
    dl_iterate_phdr(visit_object, &o);
    ipcc_fork_guard_leave(&saved);
    return o.below;
}

/* 1 if the caller is an interposer of `name` below us, looking for its own
 * next function (through the driver's handle, say): it must get the real
 * answer, or it would call us and we it. */
NOT_SANITIZED static int asked_by_interposer_below(const void *caller, const char *name)
{
    if (!below_us(caller))
        return 0;
    struct link_map *m = ipcc_object_of(caller);
    void *h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *own = ipcc_real_dlsym(h, name); /* its own definition comes first */
    dlclose(h);
    return own && ipcc_object_of(own) == m;
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
    ipcc_remember_real(h, real);
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
    ipcc_ensure_real_dlsym();
    if (!name || handle == RTLD_NEXT)
        return NULL;
    struct ipcc_hook *h = hook_by_symbol(name);
    if (!h || ipcc_config_disabled_early())
        return NULL;
    void *real = ipcc_real_dlsym(handle, name);
    if (!real || !below_us(real) || asked_by_interposer_below(caller, name))
        return NULL;
    ipcc_remember_real(h, real);
    return h->wrapper;
}
