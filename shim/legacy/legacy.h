/*
 * legacy.h - the legacy kind (cuIpcOpenMemHandle): the calls through its
 * table (tables/legacy_table.c) in legacy_calls.c, the closes
 * of what it gave up (legacy_close.c), and the exporter's and importer's
 * sides of the release ledger (legacy_exporter.c, legacy_importer.c).
 * What only the folder's own files share is in legacy_impl.h.
 */
#ifndef IPCC_LEGACY_H
#define IPCC_LEGACY_H

#include "life.h"
#include "stats.h"
#include "tables.h"

/* The table (pure C, no CUDA): tables/legacy_table.h, through tables.h. */

/* ---- legacy_calls.c: open and close through the cache ----------------------- */

IPCC_HIDDEN int ipcc_legacy_open_call(int slot, uint64_t *pdptr, const void *handle,
                                      unsigned flags);
IPCC_HIDDEN int ipcc_legacy_close_call(uint64_t dptr);
IPCC_HIDDEN int ipcc_legacy_context_id(void *ctx, uint64_t *id);
IPCC_HIDDEN void ipcc_legacy_forget_context(uint64_t ctx_id);
IPCC_HIDDEN void ipcc_legacy_sweep_contexts(void);

/* ---- legacy_close.c: the closers the idle budget runs (budget.h) -------- */

IPCC_HIDDEN void ipcc_legacy_close_taken(const struct ipcc_legacy_victim *v, size_t n);
IPCC_HIDDEN void ipcc_legacy_close_run(const struct ipcc_legacy_victim *v, size_t n, int evicted);
IPCC_HIDDEN void ipcc_legacy_close_fork_child(void);

/* legacy_exporter.c: cuIpcGetMemHandle and cuMemFree{,_v2} of exported memory. */
IPCC_HIDDEN int ipcc_legacy_export_call(void *handle, uint64_t dptr);
IPCC_HIDDEN int ipcc_legacy_free_call(int slot, uint64_t dptr);

/* legacy_exporter_teardown.c: a context's teardown frees what was exported in
 * it. Before the real cuCtxDestroy: its exports, by the context's id; after a
 * real primary release or reset: those of every context that died. */
IPCC_HIDDEN void ipcc_legacy_exporter_teardown(uint64_t ctx_id);
IPCC_HIDDEN void ipcc_legacy_exporter_sweep(void);

/* legacy_importer.c: the legacy kind's part (vmm_importer.c: ipcc_vmm_let_go, ...). */
IPCC_HIDDEN void ipcc_legacy_let_go(const void *handle);
IPCC_HIDDEN uint64_t ipcc_legacy_ghost_bytes(void);
IPCC_HIDDEN void ipcc_legacy_exporter_fork_child(void); /* forgets the parent's exports */

#endif
