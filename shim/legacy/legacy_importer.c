/*
 * legacy_importer.c - the importer's side of the release ledger for legacy
 * IPC mappings (vmm_importer.c is the VMM counterpart). The helper thread
 * (ledger_helper.c) learns that an exporter freed a handle and calls
 * ipcc_legacy_let_go: the idle mappings of that handle, in every context,
 * are closed; those the program still uses stay, marked "doomed" in the
 * table, and the program's last close of each really closes it
 * (legacy_calls.c, IPCC_RELEASE_LAST).
 *
 * The table lock is held only to take entries, never across a driver call.
 */
#include "legacy_impl.h"
#include "budget.h"
#include "ledger.h"

#define BATCH 32

/* Bytes of the mappings in use whose exporter freed them. */
uint64_t ipcc_legacy_ghost_bytes(void)
{
    const struct ipcc_legacy_table *t = ipcc_budget_legacy();
    return t ? atomic_load_explicit(&ipcc_legacy_table_gauges(t)->doomed_bytes,
                                    memory_order_relaxed)
             : 0;
}

/* Closes victims one by one until our exit began; those left are unlisted
 * (a close by the program must not wait for them) and left to the
 * process's end. Returns how many were closed. */
static size_t close_until_exit(const struct ipcc_legacy_victim *v, size_t n)
{
    size_t done = 0;
    for (; done < n && !ipcc_ledger_helper_exiting(); done++)
        ipcc_legacy_close_run(&v[done], 1, 0);
    if (done < n) {
        ipcc_lock();
        ipcc_legacy_close_untaken(v + done, n - done);
        ipcc_unlock();
    }
    return done;
}

/* The exporter freed (or took with it) the allocation behind handle: its
 * idle mappings are closed, those in use doomed. Called by ledger_helper.c
 * for every handle; VMM tags find no legacy entry. */
void ipcc_legacy_let_go(const void *handle)
{
    struct ipcc_legacy_victim v[BATCH];
    size_t n;
    do {
        if (ipcc_ledger_helper_exiting())
            return;
        ipcc_lock();
        n = ipcc_legacy_take_idle_by_handle(ipcc_budget_legacy(), handle, v, BATCH);
        ipcc_legacy_close_taken(v, n);
        ipcc_unlock();
        IPCC_ADD(releases_on_request, close_until_exit(v, n));
    } while (n == BATCH);
}
