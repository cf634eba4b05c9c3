/*
 * legacy_exporter_teardown.c - an exporter's context teardown frees what it
 * exported in that context, as its cuMemFree would.
 *
 * The driver frees a context's cuMemAlloc allocations when the context dies
 * (cuCtxDestroy, cuDevicePrimaryCtxReset, the primary context's last
 * cuDevicePrimaryCtxRelease), with no cuMemFree the library could see: an
 * importer's idle cached mapping would keep the memory. So each export made
 * in that context (legacy_exporter.c remembers where) is let go of as at its
 * free, all of them within one IPCCACHE_RELEASE_WAIT_MS.
 *
 * cuCtxDestroy names its context: importers let go before the real call, as
 * at a free. Whether a primary context's release was its last, only the
 * driver knows: after a primary release or reset, the contexts exports were
 * made in that no longer answer to their id are the dead ones, let go of
 * before the call returns. cuMemCreate's allocations (the VMM path) belong to
 * no context: a teardown leaves them, and their cuMemRelease lets go.
 */
#include "legacy_impl.h"

/* Bases taken per look at the table: the lock is never held across a let-go. */
#define BATCH 64

void ipcc_legacy_exporter_teardown(uint64_t ctx_id)
{
    if (!ipcc_legacy_exported_any())
        return;
    uint64_t deadline = ipcc_clock_ns() + ipcc_config.release_wait_ms * 1000000ULL;
    uint64_t bases[BATCH];
    size_t n;
    do { /* each pass takes what it found off the table */
        n = ipcc_legacy_exported_in(ctx_id, bases, BATCH);
        for (size_t i = 0; i < n; i++) {
            uint64_t now = ipcc_clock_ns();
            ipcc_legacy_unexport(bases[i], deadline > now ? deadline - now : 0);
        }
    } while (n == BATCH);
}

void ipcc_legacy_exporter_sweep(void)
{
    if (ipcc_legacy_exported_any())
        ipcc_legacy_sweep_dead_contexts(ipcc_legacy_export_contexts,
                                        ipcc_legacy_exporter_teardown);
}
