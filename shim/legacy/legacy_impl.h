/*
 * legacy_impl.h - what the legacy kind's files share among themselves,
 * private to shim/legacy/: the list of closes in flight (legacy_close.c),
 * which an open or close that meets one of them waits on, what gives way to
 * an open refused in another context (legacy_give_way.c), the sweep of dead
 * contexts, and the exporter's table as its teardown reads it. The kind's
 * interface is legacy.h.
 */
#ifndef IPCC_LEGACY_IMPL_H
#define IPCC_LEGACY_IMPL_H

#include "legacy.h"

IPCC_HIDDEN void ipcc_legacy_close_untaken(const struct ipcc_legacy_victim *v, size_t n);
IPCC_HIDDEN int ipcc_legacy_close_pending(uint64_t ctx_id, uint64_t dptr);
IPCC_HIDDEN void ipcc_legacy_close_wait(uint64_t ctx_id, uint64_t dptr);
IPCC_HIDDEN uint64_t ipcc_legacy_closes_ended(void);
IPCC_HIDDEN size_t ipcc_legacy_close_wait_elsewhere(uint64_t keep_ctx_id,
                                                    ipcc_legacy_handle_test in_the_way,
                                                    void *arg);

/* legacy_give_way.c: what may stand in the way of an open the driver
 * refused in one context, because of our mappings in others. */
struct ipcc_legacy_way {
    uint64_t ctx_id;                         /* the open's context */
    unsigned char handle[IPCC_HANDLE_BYTES]; /* the handle it opens */
    int known;                               /* its exporter is known: */
    struct ipcc_proc exporter;
    int anyone;                              /* unknown, and may be anyone's */
};
IPCC_HIDDEN void ipcc_legacy_way_of(struct ipcc_legacy_way *w, uint64_t ctx_id,
                                    const void *handle);
IPCC_HIDDEN size_t ipcc_legacy_close_in_the_way(struct ipcc_legacy_way *w);
IPCC_HIDDEN size_t ipcc_legacy_close_wait_in_the_way(struct ipcc_legacy_way *w);
IPCC_HIDDEN int ipcc_legacy_context_is(void *ctx, uint64_t id);

/* legacy_close.c: the loop both sweeps run over their contexts
 * (ipcc_legacy_sweep_contexts, ipcc_legacy_exporter_sweep). */
typedef size_t (*ipcc_legacy_context_list)(void **ctxs, uint64_t *ids, size_t cap);
typedef void (*ipcc_legacy_context_gone)(uint64_t ctx_id);
IPCC_HIDDEN void ipcc_legacy_sweep_dead_contexts(ipcc_legacy_context_list list,
                                                 ipcc_legacy_context_gone gone);

/* legacy_exporter.c's table, for legacy_exporter_teardown.c. */
IPCC_HIDDEN int ipcc_legacy_exported_any(void); /* one load: 0 until something is */
IPCC_HIDDEN void ipcc_legacy_unexport(uint64_t base, uint64_t wait_ns);
IPCC_HIDDEN size_t ipcc_legacy_exported_in(uint64_t ctx_id, uint64_t *bases, size_t cap);
IPCC_HIDDEN size_t ipcc_legacy_export_contexts(void **ctxs, uint64_t *ids, size_t cap);

#endif
