/*
 * budget_tables.c - the layer below both kinds of mapping: it owns the
 * legacy IPC table (legacy_table.c) and the VMM table (vmm_table.c,
 * vmm_ranges.c). It creates them, forgets them in a fork child, totals
 * their gauges for the stats, and keeps the one idle budget:
 * IPCCACHE_MAX_IDLE_BYTES and IPCCACHE_MAX_IDLE_ENTRIES count idle legacy
 * mappings and idle VMM imports together, and the least recently used idle
 * thing of either kind goes first.
 *
 * The kinds on top (legacy_calls.c, vmm_calls.c) find their table here;
 * idle_budget.c and the stats (through entry/wiring.c) know only this
 * file. No driver call: what an eviction must really close comes back as
 * legacy victims and VMM orders, which the caller runs after dropping the
 * lock, each kind in its own way.
 */
#include <pthread.h>
#include <unistd.h>

#include "budget_impl.h"

static struct ipcc_legacy_table *_Atomic legacy;
static struct ipcc_vmm_table *_Atomic vmm;
static pthread_once_t vmm_once = PTHREAD_ONCE_INIT;

/* ---- creation ------------------------------------------------------------ */

/* At the first intercepted call (lifecycle.c): -1 when out of memory. */
int ipcc_budget_start(void)
{
    struct ipcc_legacy_table *c = ipcc_legacy_table_create();
    atomic_store(&legacy, c);
    return c ? 0 : -1;
}

static _Atomic(ipcc_vmm_cmp_fn) vmm_cmp; /* the kind's, given at the first import */
static _Atomic(ipcc_vmm_same_fn) vmm_same;

static void create_vmm(void)
{
    struct ipcc_vmm_table *t = ipcc_vmm_table_create(atomic_load(&vmm_cmp), atomic_load(&vmm_same));
    if (!t)
        ipcc_log(IPCC_LOG_WARN, "out of memory; VMM imports are not cached");
    atomic_store(&vmm, t);
}

/* At the first import (vmm_calls.c): a process that never imports has no VMM
 * table. NULL when out of memory. */
struct ipcc_vmm_table *ipcc_budget_vmm_start(ipcc_vmm_cmp_fn cmp, ipcc_vmm_same_fn same)
{
    atomic_store(&vmm_cmp, cmp); /* every caller gives the same two */
    atomic_store(&vmm_same, same);
    pthread_once(&vmm_once, create_vmm);
    return atomic_load(&vmm);
}

struct ipcc_legacy_table *ipcc_budget_legacy(void)
{
    return atomic_load_explicit(&legacy, memory_order_acquire);
}

struct ipcc_vmm_table *ipcc_budget_vmm(void)
{
    return atomic_load_explicit(&vmm, memory_order_acquire);
}

static void close_fd(int fd)
{
    ipcc_fd_close_ours(fd); /* one the program took over stays its own */
}

/* Fork child, lock held: the mappings belong to the parent's driver state.
 * Forgets them all with no CUDA call; closes the kept dups (ours). The
 * tables themselves stay, so the signal handler never reads freed memory. */
void ipcc_budget_fork_child(void)
{
    struct ipcc_legacy_table *c = ipcc_budget_legacy();
    ipcc_legacy_loan_fork_child(c);
    if (c)
        ipcc_legacy_table_clear(c);
    ipcc_vmm_table_clear(ipcc_budget_vmm(), close_fd);
}

/* ---- gauges: read by the signal handler, so atomic loads only ----------- */

static uint64_t load(const _Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* Both kinds' totals; zeros before the tables exist. Async-signal-safe. */
void ipcc_budget_gauges(struct ipcc_budget_gauges *out)
{
    struct ipcc_legacy_table *c = ipcc_budget_legacy();
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    struct ipcc_legacy_totals g = { 0, 0, 0 };
    const struct ipcc_vmm_gauges *v = t ? ipcc_vmm_table_gauges(t) : NULL;
    if (c)
        ipcc_legacy_gauges_now(c, &g); /* entries lent to threads included */
    out->live = g.live;
    out->vmm_idle = v ? load(&v->idle_entries) : 0;
    out->vmm_idle_bytes = v ? load(&v->idle_bytes) : 0;
    out->vmm_fds = v ? load(&v->kept_fds) : 0;
    out->idle = g.idle + out->vmm_idle;
    out->idle_bytes = g.idle_bytes + out->vmm_idle_bytes;
}

/* Idle things of both kinds, counting every entry lent to threads as idle,
 * once however many hold it (their closes are not checked against the budget). */
static void idle_bound(uint64_t *bytes, uint64_t *entries)
{
    struct ipcc_legacy_table *c = ipcc_budget_legacy();
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    const struct ipcc_legacy_gauges *g = c ? ipcc_legacy_table_gauges(c) : NULL;
    const struct ipcc_vmm_gauges *v = t ? ipcc_vmm_table_gauges(t) : NULL;
    ipcc_legacy_loan_totals(entries, bytes);
    *entries += (g ? load(&g->idle) : 0) + (v ? load(&v->idle_entries) : 0);
    *bytes += (g ? load(&g->idle_bytes) : 0) + (v ? load(&v->idle_bytes) : 0);
}

/* What the caps leave for one more thing idle, lent entries counted idle. */
void ipcc_budget_room(uint64_t max_bytes, uint64_t max_entries, uint64_t *room_bytes,
                      uint64_t *room_entries)
{
    uint64_t bytes, entries;
    idle_bound(&bytes, &entries);
    *room_bytes = bytes < max_bytes ? max_bytes - bytes : 0;
    *room_entries = entries < max_entries ? max_entries - entries : 0;
}

/* The legacy table's mirrored entries, their loans counted; none (every
 * slot unused) before start. Async-signal-safe. */
void ipcc_budget_top(struct ipcc_top_slot *out)
{
    struct ipcc_legacy_table *c = ipcc_budget_legacy();
    if (c)
        ipcc_legacy_top_now(c, out);
    else
        for (int i = 0; i < IPCC_TOP_SLOTS; i++)
            atomic_store_explicit(&out[i].used, 0, memory_order_relaxed);
}

/* ---- the one budget ------------------------------------------------------ */

/* Whether idle things of both kinds together exceed either cap. Gauges
 * only: also a cheap check without the lock. */
int ipcc_budget_over(uint64_t max_bytes, uint64_t max_entries)
{
    uint64_t bytes, entries;
    idle_bound(&bytes, &entries);
    return bytes > max_bytes || entries > max_entries;
}

/* Takes the least recently used idle thing of either kind: a legacy
 * mapping into out[*nout], or a VMM teardown into ops. 0 when nothing is. */
static int take_oldest(struct ipcc_legacy_victim *out, size_t *nout, struct ipcc_vmm_ops *ops)
{
    struct ipcc_legacy_table *c = ipcc_budget_legacy();
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    uint64_t legacy_ns = 0, vmm_ns = 0;
    int has_legacy = c && ipcc_legacy_oldest_idle(c, &legacy_ns);
    int has_vmm = t && ipcc_vmm_oldest_idle(t, &vmm_ns);
    if (has_legacy && (!has_vmm || legacy_ns <= vmm_ns)) {
        /* Caps of 0: the one entry idle the longest. */
        *nout += ipcc_legacy_evict(c, 0, 0, &out[*nout], 1);
        return 1;
    }
    return has_vmm && ipcc_vmm_evict_one(t, ops);
}

/*
 * Under the caller's lock: takes idle things, least recently used first
 * across both kinds, while over the budget (b->all: while anything is idle),
 * at most cap of them. Legacy victims go to out[] (*nout of them), VMM
 * teardowns to ops. Returns how many things were taken: cap means the
 * caller should come back for more once it has closed these.
 */
size_t ipcc_budget_take_idle(const struct ipcc_budget *b, struct ipcc_legacy_victim *out,
                             size_t cap, size_t *nout, struct ipcc_vmm_ops *ops)
{
    size_t taken = 0;
    *nout = 0;
    if (ipcc_budget_legacy())
        ipcc_legacy_loan_recall_all(ipcc_budget_legacy()); /* their idle times count too */
    while (taken < cap && (b->all || ipcc_budget_over(b->max_bytes, b->max_entries)) &&
           take_oldest(out, nout, ops))
        taken++;
    return taken;
}
