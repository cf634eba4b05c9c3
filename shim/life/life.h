/*
 * life.h - the process's life: start at the first IPC call, fork, exit
 * (lifecycle.c). The layers above register what runs at start, exit and
 * fork; the counters and the stats line are the layer below's (stats.h).
 */
#ifndef IPCC_LIFE_H
#define IPCC_LIFE_H

#include "base.h"

/* Every intercepted call comes through here: one load once started. */
IPCC_HIDDEN extern _Atomic int ipcc_life_started;
IPCC_HIDDEN void ipcc_lifecycle_start_now(void);
static inline void ipcc_lifecycle_start(void)
{
    if (__builtin_expect(!atomic_load_explicit(&ipcc_life_started, memory_order_acquire), 0))
        ipcc_lifecycle_start_now();
}

/* What the layers above have run at start, exit and fork (entry/wiring.c
 * registers it at load). fork_child is every layer's reset, the one list,
 * run in its order by the one child handler (lifecycle.c); no CUDA call in
 * them: the child's driver state is not usable. */
struct ipcc_life_hooks {
    int (*start)(void);          /* at the first IPC call; < 0: out of memory */
    void (*release_idle)(void);  /* at exit, after the stats line */
    void (*const *fork_child)(void);
    size_t fork_children;
};
IPCC_HIDDEN void ipcc_life_register(const struct ipcc_life_hooks *h);

#endif
