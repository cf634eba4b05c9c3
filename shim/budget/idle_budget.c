/*
 * idle_budget.c - the one idle budget, enforced for both kinds of mapping: past
 * IPCCACHE_MAX_IDLE_BYTES or IPCCACHE_MAX_IDLE_ENTRIES (legacy idle mappings
 * and idle VMM imports counted together) the least recently used idle thing
 * of either kind goes; everything idle goes when the driver runs out of
 * memory and at exit.
 *
 * An idle mapping pins the exporter's memory (the docs call freeing exported
 * memory while it is mapped undefined; in practice it stays allocated), so
 * the caps bound what we keep.
 *
 * Knows only the tables (budget_tables.c, tables/): it takes a batch under the
 * lock, drops the lock, then each kind really closes its own victims in its
 * own way, through the closers it registered: legacy mappings in their own
 * context (legacy_close.c), VMM orders with none needed (vmm_close.c). No
 * lock is held across a driver call.
 */
#include "budget_impl.h"

#define BATCH 32

static const struct ipcc_budget_closers *closers; /* set at load, before any call */

void ipcc_budget_register(const struct ipcc_budget_closers *c)
{
    closers = c;
}

/* What one batch takes under the lock: legacy victims into out[] (*nout),
 * VMM orders into ops; returns how many things it took. */
typedef size_t (*take_fn)(const void *arg, struct ipcc_legacy_victim *out, size_t cap,
                          size_t *nout, struct ipcc_vmm_ops *ops);

/* Takes and closes a batch at a time until a batch comes back short.
 * Returns how many things were taken. */
static size_t close_in_batches(take_fn take, const void *arg, int evicted)
{
    struct ipcc_legacy_victim victims[BATCH];
    size_t n, nlegacy, total = 0;
    do {
        struct ipcc_vmm_ops ops = { 0 };
        ipcc_lock();
        n = take(arg, victims, BATCH, &nlegacy, &ops);
        closers->legacy_taken(victims, nlegacy);
        closers->vmm_taken(&ops);
        ipcc_unlock();
        closers->legacy_run(victims, nlegacy, evicted);
        closers->vmm_run(&ops, evicted);
        total += n;
    } while (n == BATCH);
    return total;
}

static size_t take_idle(const void *arg, struct ipcc_legacy_victim *out, size_t cap, size_t *nout,
                        struct ipcc_vmm_ops *ops)
{
    return ipcc_budget_take_idle(arg, out, cap, nout, ops);
}

/* Called by either kind after a call that left something idle; the common
 * case, under both caps, costs a few atomic loads and no lock. */
void ipcc_budget_evict_over_caps(void)
{
    const struct ipcc_budget b = { ipcc_config.max_idle_bytes, ipcc_config.max_idle_entries, 0 };
    if (ipcc_budget_over(b.max_bytes, b.max_entries))
        close_in_batches(take_idle, &b, 1);
}

/* Under the lock: the VMM path's idle things, least recently used first,
 * while it keeps more dups than *arg (each cached import keeps one). */
static size_t take_for_fds(const void *arg, struct ipcc_legacy_victim *out, size_t cap,
                           size_t *nout, struct ipcc_vmm_ops *ops)
{
    (void)out; /* legacy mappings keep no fd */
    struct ipcc_vmm_table *t = ipcc_budget_vmm();
    size_t keep = *(const size_t *)arg, taken = 0;
    *nout = 0;
    while (t && taken < cap && ipcc_vmm_table_fds(t) > keep && ipcc_vmm_evict_one(t, ops))
        taken++;
    return taken;
}

/* The VMM path is at its bound on kept fds (vmm_fds.c): idle imports give
 * theirs up until at most keep are left, or nothing is idle. */
void ipcc_budget_evict_fds_over(size_t keep)
{
    close_in_batches(take_for_fds, &keep, 1);
}

/* The driver is out of memory or handles: everything idle, of both kinds,
 * gives way (counted as evictions). */
void ipcc_budget_give_way_all(void)
{
    const struct ipcc_budget all = { 0, 0, 1 };
    close_in_batches(take_idle, &all, 1);
}

/* At exit, after the stats line: the application is done with idle things;
 * give the exporters their memory back while the driver is still up. */
void ipcc_budget_release_all(void)
{
    const struct ipcc_budget all = { 0, 0, 1 };
    close_in_batches(take_idle, &all, 0);
}
