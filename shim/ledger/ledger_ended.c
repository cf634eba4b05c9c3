/*
 * ledger_ended.c - listings that ended, for every process: when a new export
 * takes over an entry whose handle was let go of (its exporter freed it) or
 * whose exporter died, the handle's fingerprint joins a ring in the ledger
 * file. An import of it after that (its memory lives while another importer
 * maps it) is then known as let go, not as one of an exporter without the
 * library, for as long as the ring holds it: 8,192 ended listings.
 */
#include <stdint.h>

#include "ledger_impl.h"

uint64_t ipcc_ledger_fingerprint(const unsigned char *h)
{
    uint64_t x = 14695981039346656037ull;
    for (int i = 0; i < IPCC_HANDLE_BYTES; i++)
        x = (x ^ h[i]) * 1099511628211ull;
    return x | 1; /* 0 marks an empty place */
}

/* Called before the entry is claimed: its handle is let go of or its
 * exporter dead whether or not this claim wins (a torn read of a handle
 * being written only adds a fingerprint nobody has). */
void ipcc_ledger_listing_ends(struct ipcc_ledger_file *f, const struct ipcc_ledger_export *e)
{
    uint32_t at = atomic_fetch_add_explicit(&f->ended_next, 1, memory_order_relaxed);
    atomic_store_explicit(&f->ended[at % IPCC_LEDGER_ENDED], ipcc_ledger_fingerprint(e->handle),
                          memory_order_release);
}

/* Whether handle's listing ended lately. Read only for a handle the table
 * does not list (a miss of an exporter without the library): a scan of
 * 64 KiB. */
int ipcc_ledger_listing_ended(struct ipcc_ledger_file *f, const unsigned char *handle)
{
    uint64_t fp = ipcc_ledger_fingerprint(handle);
    for (int i = 0; i < IPCC_LEDGER_ENDED; i++)
        if (atomic_load_explicit(&f->ended[i], memory_order_acquire) == fp)
            return 1;
    return 0;
}
