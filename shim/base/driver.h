/* driver.h - driver.c's interface: the real driver, and the rows of the hook table. */
#ifndef IPCC_DRIVER_H
#define IPCC_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Real driver entry points the cache itself needs (never hooked ones). */
struct ipcc_driver {
    int (*ctx_get_current)(void **ctx);
    int (*ctx_get_id)(void *ctx, unsigned long long *id);
    int (*ctx_push)(void *ctx);
    int (*ctx_pop)(void **ctx);
    int (*mem_get_range)(uint64_t *base, size_t *size, uint64_t dptr);
    int (*thread_capture_mode)(int *mode); /* cuThreadExchangeStreamCaptureMode */
};

IPCC_HIDDEN const struct ipcc_driver *ipcc_driver(void);
IPCC_HIDDEN void *ipcc_real(int slot);
IPCC_HIDDEN extern void *(*ipcc_real_dlsym)(void *, const char *);

/* Slots of the hook table, one per row of hooks.def; resolve.c owns the
 * table, hooks.c the wrappers. */
enum ipcc_slot {
#define IPCC_HOOK(slot, sym, proc, since) IPCC_SLOT_##slot,
#include "hooks.def"
#undef IPCC_HOOK
    IPCC_SLOT_COUNT
};

/* One row per exported wrapper: the one table every resolver path uses. */
struct ipcc_hook {
    const char *symbol;     /* exported name, as dlsym is asked for it */
    const char *proc_name;  /* name cuGetProcAddress is asked for */
    int since;              /* first CUDA version whose ABI this row is */
    void *wrapper;
    void *_Atomic real;
};

/* The table hooks.c defines, registered at load (entry/wiring.c); NULL before. */
IPCC_HIDDEN void ipcc_hooks_register(struct ipcc_hook *table);
IPCC_HIDDEN struct ipcc_hook *ipcc_hook_table(void);
IPCC_HIDDEN void ipcc_remember_real(struct ipcc_hook *h, void *real);
IPCC_HIDDEN void ipcc_ensure_real_dlsym(void);
struct link_map;
IPCC_HIDDEN struct link_map *ipcc_object_of(const void *addr);

#endif
