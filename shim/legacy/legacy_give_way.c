/*
 * legacy_give_way.c - what gives way to an open the driver refused
 * (CUDA_ERROR_INVALID_HANDLE) because of our idle mappings in another
 * context.
 *
 * The driver lets one exporting process's handles be open in only one
 * context per device of the importer (cuIpcOpenMemHandle's docs; the
 * stand-in enforces it so). An idle mapping we keep in another context
 * would make an open fail that succeeds without us: those of the same
 * allocation or the same exporter give way. Any other refusal (a stale
 * handle, another exporter's) must not cost the other contexts their cache:
 * the exporter of each handle is what the release ledger said at our miss
 * of it (ledger_helper.c); a mapping whose exporter nobody told us may be
 * anyone's, and gives way, as does every mapping when the open's own
 * exporter is unknown while some exporter could not list its handles.
 *
 * The table lock is held only to take the mappings, never across a close.
 */
#include <string.h>

#include "legacy_impl.h"
#include "budget.h"
#include "ledger.h"

#define BATCH 32

void ipcc_legacy_way_of(struct ipcc_legacy_way *w, uint64_t ctx_id, const void *handle)
{
    memset(w, 0, sizeof(*w));
    w->ctx_id = ctx_id;
    memcpy(w->handle, handle, IPCC_HANDLE_BYTES);
    w->known = ipcc_ledger_owner(handle, &w->exporter) == 1;
    w->anyone = !w->known && ipcc_ledger_unpublished();
}

/* Lock held: whether our mapping opened through handle may be in w's way. */
static int in_the_way(const void *handle, void *way)
{
    const struct ipcc_legacy_way *w = way;
    struct ipcc_proc who;
    if (memcmp(handle, w->handle, IPCC_HANDLE_BYTES) == 0)
        return 1; /* the same allocation */
    if (!ipcc_ledger_import_exporter(handle, &who))
        return 1;
    if (w->known)
        return who.pid == w->exporter.pid && who.start == w->exporter.start;
    return w->anyone;
}

/* Closes our idle mappings in other contexts that may be in w's way;
 * returns how many. */
size_t ipcc_legacy_close_in_the_way(struct ipcc_legacy_way *w)
{
    struct ipcc_legacy_victim v[BATCH];
    size_t n, total = 0;
    if (!ipcc_budget_legacy())
        return 0;
    do {
        ipcc_lock();
        n = ipcc_legacy_evict_other_contexts(ipcc_budget_legacy(), w->ctx_id,
                                             in_the_way, w, v, BATCH);
        ipcc_legacy_close_taken(v, n);
        ipcc_unlock();
        ipcc_legacy_close_run(v, n, 1);
        total += n;
    } while (n == BATCH);
    return total;
}

/* Waits for the closes other threads have in flight in other contexts of
 * mappings that may be in w's way; returns how many. */
size_t ipcc_legacy_close_wait_in_the_way(struct ipcc_legacy_way *w)
{
    return ipcc_legacy_close_wait_elsewhere(w->ctx_id, in_the_way, w);
}
