/*
 * legacy_importer.c - the importer's side of the release ledger for legacy
 * IPC mappings (vmm_importer.c is the VMM counterpart). The helper thread
 * (ledger_helper.c) learns that an exporter freed a handle and calls
 * ipcc_legacy_let_go: the idle mappings of that handle, in every context,
 * are closed; those the program still uses stay, and the handle is "doomed"
 * until the program's last close of it really closes it.
 *
 * The table lock is held only to take entries or update the set, never
 * across a driver call.
 */
#include "legacy_impl.h"
#include "budget.h"
#include "ledger.h"

#define BATCH 32

/* Handles freed by their exporter while the program still used them. */
static struct ipcc_keyset doomed;
static _Atomic uint64_t ghost;

uint64_t ipcc_legacy_ghost_bytes(void)
{
    return atomic_load_explicit(&ghost, memory_order_relaxed);
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

/* Closes the idle mappings of handle; returns the bytes still referenced. */
static uint64_t close_idle_of(const unsigned char *handle)
{
    struct ipcc_legacy_victim v[BATCH];
    uint64_t live = 0;
    size_t n;
    do {
        if (ipcc_ledger_helper_exiting())
            return live;
        live = 0;
        ipcc_lock();
        n = ipcc_legacy_take_idle_by_handle(ipcc_budget_legacy(), handle, v, BATCH, &live);
        ipcc_legacy_close_taken(v, n);
        ipcc_unlock();
        IPCC_ADD(releases_on_request, close_until_exit(v, n));
    } while (n == BATCH);
    return live;
}

/* The exporter freed (or took with it) the allocation behind handle. Called
 * by ledger_helper.c for every handle; VMM tags find no legacy entry. */
void ipcc_legacy_let_go(const void *handle)
{
    uint64_t live = close_idle_of(handle);
    if (!live)
        return;
    ipcc_lock();
    if (ipcc_keyset_add(&doomed, handle) < 0)
        ipcc_log(IPCC_LOG_DEBUG, "too many freed allocations still in use; one will stay mapped");
    atomic_fetch_add(&ghost, live);
    ipcc_unlock();
}

static uint64_t let_go_of_handle(const unsigned char *handle, int *in_use, void *arg)
{
    (void)arg;
    uint64_t live = close_idle_of(handle);
    *in_use = live != 0;
    return live;
}

/* After each close by the program: one load, unless some allocation was
 * freed while in use here; then its last close really closes it. */
void ipcc_legacy_after_close(void)
{
    if (ipcc_keyset_count(&doomed) == 0 || !ipcc_budget_legacy())
        return;
    atomic_store(&ghost, ipcc_keyset_sweep(&doomed, let_go_of_handle, NULL));
}

/* Fork child: the parent's mappings are gone from the table already. */
void ipcc_legacy_importer_fork_child(void)
{
    ipcc_keyset_reset(&doomed);
    atomic_store(&ghost, 0);
}
