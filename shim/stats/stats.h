/*
 * stats.h - the counters (striped, one cache line per thread), the stats line
 * and its signal (stats.c), and the figures the layers above register for it
 * (entry/wiring.c); the marker saying this process answers is stats_impl.h's.
 */
#ifndef IPCC_STATS_H
#define IPCC_STATS_H

#include "base.h"

/* Each call is counted once, by outcome; totals (opens, closes,
 * passthrough) are sums computed by the reader. */
struct ipcc_counters {
    _Atomic uint64_t hits, misses, open_passthrough;
    _Atomic uint64_t hits_locked;         /* hits that took the table lock */
    _Atomic uint64_t close_cached, close_passthrough, close_past_zero;
    _Atomic uint64_t real_opens, real_closes, evictions, invalidations, errors;
    _Atomic uint64_t real_open_ns, real_open_samples;
    _Atomic uint64_t real_close_ns, real_close_samples;
    _Atomic uint64_t vmm_imports, vmm_import_hits, vmm_maps, vmm_map_hits, vmm_access_skips;
    _Atomic uint64_t releases_on_request; /* idle mappings closed for their exporter */
};

/* Counters are striped: a thread counts on a stripe of its own, a cache line
 * no other thread writes, with a plain load and store (no locked instruction
 * on the hit path). Threads beyond the owned stripes, and a thread's counts
 * after its stripe went back at its exit, go to the last stripe, shared, with
 * atomic adds. Readers sum the stripes. */
#define IPCC_STRIPES 64
#define IPCC_SHARED_STRIPE (IPCC_STRIPES - 1)
struct ipcc_counter_stripe {
    struct ipcc_counters c;
    _Atomic int taken; /* by a thread, for its life; never the shared one */
} __attribute__((aligned(128)));

IPCC_HIDDEN extern struct ipcc_counter_stripe ipcc_stripes[IPCC_STRIPES];
IPCC_HIDDEN extern __thread struct ipcc_counters *ipcc_stripe_here
    __attribute__((tls_model("initial-exec")));
IPCC_HIDDEN struct ipcc_counters *ipcc_take_stripe(void);
IPCC_HIDDEN uint64_t ipcc_stat_sum(size_t field_offset);

static inline void ipcc_counter_add(size_t field_offset, uint64_t n)
{
    struct ipcc_counters *s = ipcc_stripe_here;
    if (__builtin_expect(s == NULL, 0))
        s = ipcc_take_stripe();
    _Atomic uint64_t *f = (_Atomic uint64_t *)((char *)s + field_offset);
    if (s == &ipcc_stripes[IPCC_SHARED_STRIPE].c)
        atomic_fetch_add_explicit(f, n, memory_order_relaxed);
    else /* ours alone: the signal handler only reads */
        atomic_store_explicit(f, atomic_load_explicit(f, memory_order_relaxed) + n,
                              memory_order_relaxed);
}
#define IPCC_ADD(field, n) ipcc_counter_add(offsetof(struct ipcc_counters, field), (n))
#define IPCC_COUNT(field) IPCC_ADD(field, 1)
#define IPCC_TOTAL(field) ipcc_stat_sum(offsetof(struct ipcc_counters, field))

/* A few entries mirrored into fixed slots so the signal handler can list them
 * without taking the lock. Fields may be momentarily inconsistent. */
#define IPCC_TOP_SLOTS 16
struct ipcc_top_slot {
    _Atomic int used;
    _Atomic uint64_t ctx_id;
    _Atomic uint64_t hits;
    _Atomic uint64_t refs;
    _Atomic uint64_t bytes;
    _Atomic uint64_t created_ns;
} __attribute__((aligned(64))); /* a line each: threads hitting two entries do not share one */

/* Both kinds' gauges, read at one moment (fields may be momentarily
 * inconsistent). idle and idle_bytes count both kinds; vmm_* the VMM part. */
struct ipcc_budget_gauges {
    uint64_t live, idle, idle_bytes, vmm_idle, vmm_idle_bytes, vmm_fds;
};

/* The figures the stats line shows from the layers above (registered at
 * load by entry/wiring.c; async-signal-safe, the handler calls them). */
struct ipcc_stats_sources {
    void (*gauges)(struct ipcc_budget_gauges *out);
    void (*top)(struct ipcc_top_slot *out); /* fills IPCC_TOP_SLOTS */
    uint64_t (*ghost_bytes)(void);
};
IPCC_HIDDEN void ipcc_stats_register(const struct ipcc_stats_sources *s);

IPCC_HIDDEN void ipcc_stats_reset(void);
IPCC_HIDDEN void ipcc_stats_fork_child(void); /* counters zeroed, then the marker */
IPCC_HIDDEN void ipcc_stats_install_handler(void);
IPCC_HIDDEN void ipcc_stats_write_line(void);

#endif
