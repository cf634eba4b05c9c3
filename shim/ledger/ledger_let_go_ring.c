/*
 * ledger_let_go_ring.c - the handles this importer let go of (asked by their
 * exporter, or at its death), as 64-bit fingerprints in a fixed ring: the
 * oldest goes first. A later import of such a handle that the ledger no
 * longer knows (its entry was taken over while another importer kept the
 * memory mapped) is of freed memory, not of an exporter without the
 * library: ledger_helper.c lets it go at once. A false match only costs a
 * cache hit. Under the table lock; a fork child keeps its copy (harmless).
 */
#include <stdint.h>

#include "ledger_impl.h"

#define RING 4096 /* 32 KiB */

static uint64_t ring[RING];
static unsigned next, used; /* used: places filled, so an importer that never
                             * let go of anything scans none on a miss */

/* Lock held. */
int ipcc_ledger_was_let_go(const unsigned char *handle)
{
    uint64_t f = ipcc_ledger_fingerprint(handle);
    for (unsigned i = 0; i < used; i++)
        if (ring[i] == f)
            return 1;
    return 0;
}

/* Lock held. */
void ipcc_ledger_remember_let_go(const unsigned char *handle)
{
    if (ipcc_ledger_was_let_go(handle))
        return;
    ring[next] = ipcc_ledger_fingerprint(handle);
    next = (next + 1) % RING;
    if (used < RING)
        used++;
}
