/*
 * vmm.h - the VMM kind (cuMemImportFromShareableHandle, cuMemMap): the
 * calls through its table (tables/vmm_table.h) in vmm_calls.c, what identifies
 * an export (vmm_identity.c), the releases of what the table gave up
 * (vmm_close.c), and the exporter's and importer's sides of the release
 * ledger (vmm_exporter.c, vmm_importer.c). What only the folder's own files
 * share is in vmm_impl.h.
 */
#ifndef IPCC_VMM_H
#define IPCC_VMM_H

#include "life.h"
#include "stats.h"
#include "tables.h"

/* The table and the predictor (pure C, no CUDA): tables/vmm_table.h,
 * through tables.h. */

/* ---- vmm_calls.c: the VMM sharing path through the cache ---------------- */

/* Each takes the driver function's own arguments (handles and pointers as
 * 64-bit integers) and returns its CUresult. */
IPCC_HIDDEN int ipcc_vmm_import_call(uint64_t *handle, void *os_handle, int type);
IPCC_HIDDEN int ipcc_vmm_reserve_call(uint64_t *ptr, size_t size, size_t align, uint64_t addr,
                                      unsigned long long flags);
IPCC_HIDDEN int ipcc_vmm_free_call(uint64_t ptr, size_t size);
IPCC_HIDDEN int ipcc_vmm_map_call(uint64_t ptr, size_t size, size_t offset, uint64_t handle,
                                  unsigned long long flags);
IPCC_HIDDEN int ipcc_vmm_unmap_call(uint64_t ptr, size_t size);
IPCC_HIDDEN int ipcc_vmm_set_access_call(uint64_t ptr, size_t size, const void *desc,
                                         size_t count);
IPCC_HIDDEN int ipcc_vmm_get_access_call(unsigned long long *flags, const void *location,
                                         uint64_t ptr);
IPCC_HIDDEN int ipcc_vmm_release_call(uint64_t handle);
IPCC_HIDDEN void ipcc_vmm_fork_child(void);  /* forgets this thread's recent imports */

/* ---- the fork resets (vmm_identity.c, vmm_exporter.c, vmm_importer.c) -- */

IPCC_HIDDEN void ipcc_vmm_identity_fork_child(void); /* forgets the pid kcmp uses */
IPCC_HIDDEN void ipcc_vmm_exporter_fork_child(void); /* forgets the parent's exports */
IPCC_HIDDEN void ipcc_vmm_importer_fork_child(void); /* doomed tags, ghost bytes, the guess */

/* ---- vmm_close.c: the closers the idle budget runs (budget.h) ----------- */

IPCC_HIDDEN void ipcc_vmm_close_run(struct ipcc_vmm_ops *ops, int evicted);
IPCC_HIDDEN void ipcc_vmm_close_taken(const struct ipcc_vmm_ops *ops);

/* ---- the release ledger on the VMM path (vmm_exporter.c, vmm_importer.c) ----
 * An exported POSIX fd is published as a tag: 64 bytes naming the exporter
 * (pid, start time), the fd number it got and a serial; an importer finds
 * the tag of an fd it imports by comparing that fd with kcmp. */
IPCC_HIDDEN int ipcc_vmm_export_call(void *out, uint64_t handle, int type,
                                     unsigned long long flags);
IPCC_HIDDEN void ipcc_vmm_let_go(const void *tag);
IPCC_HIDDEN uint64_t ipcc_vmm_ghost_bytes(void);

#endif
