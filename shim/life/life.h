/*
 * life.h - the process's life: start at the first IPC call, fork, exit
 * (lifecycle.c), the counters and the stats line (stats.c) and its marker
 * (marker.c). The layers above register what runs at start, exit and fork,
 * and the figures the line shows.
 */
#ifndef IPCC_LIFE_H
#define IPCC_LIFE_H

#include "base.h"

IPCC_HIDDEN void ipcc_lifecycle_start(void);

/* What the layers above have run at start, exit and fork (entry/wiring.c
 * registers it at load). No CUDA call in fork_child: the child's driver
 * state is not usable. */
#define IPCC_LIFE_RESETS 8
struct ipcc_life_hooks {
    int (*start)(void);          /* at the first IPC call; < 0: out of memory */
    void (*release_idle)(void);  /* at exit, after the stats line */
    void (*fork_child[IPCC_LIFE_RESETS])(void); /* in order; NULL ends */
};
IPCC_HIDDEN void ipcc_life_register(const struct ipcc_life_hooks *h);

/* ---- stats.c ------------------------------------------------------------- */

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

/* Counters are striped: each thread adds to its own cache line, so threads
 * hitting the cache at once do not fight over the counters' line. Readers
 * sum the stripes. */
#define IPCC_STRIPES 64
struct ipcc_counter_stripe {
    struct ipcc_counters c;
} __attribute__((aligned(128)));

IPCC_HIDDEN extern struct ipcc_counter_stripe ipcc_stripes[IPCC_STRIPES];
IPCC_HIDDEN struct ipcc_counters *ipcc_my_stripe(void);
IPCC_HIDDEN uint64_t ipcc_stat_sum(size_t field_offset);
#define IPCC_ADD(field, n) \
    atomic_fetch_add_explicit(&ipcc_my_stripe()->field, (n), memory_order_relaxed)
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
struct ipcc_tables_gauges {
    uint64_t live, idle, idle_bytes, vmm_idle, vmm_idle_bytes;
};
IPCC_HIDDEN void ipcc_tables_gauges(struct ipcc_tables_gauges *out);
IPCC_HIDDEN void ipcc_tables_top(struct ipcc_top_slot *out);

/* The figures the stats line shows from the layers above (registered at
 * load by entry/wiring.c; async-signal-safe, the handler calls them). */
struct ipcc_tables_gauges;
struct ipcc_stats_sources {
    void (*gauges)(struct ipcc_tables_gauges *out);
    void (*top)(struct ipcc_top_slot *out); /* fills IPCC_TOP_SLOTS */
    uint64_t (*ghost_bytes)(void);
};
IPCC_HIDDEN void ipcc_stats_register(const struct ipcc_stats_sources *s);

IPCC_HIDDEN uint64_t ipcc_now_ns(void);
IPCC_HIDDEN void ipcc_stats_reset(void);
IPCC_HIDDEN void ipcc_stats_install_handler(void);
IPCC_HIDDEN void ipcc_stats_write_line(void);
IPCC_HIDDEN size_t ipcc_stats_format(char *buf, size_t cap);

/* ---- marker.c: "this process answers the stats signal" ----------------- */


IPCC_HIDDEN int ipcc_marker_write(int sig, const char *request_dir);

#endif
