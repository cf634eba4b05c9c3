/*
 * legacy_impl.h - what the legacy kind's files share among themselves,
 * private to shim/legacy/: the list of closes in flight (legacy_close.c),
 * which an open or close that meets one of them waits on. The kind's
 * interface is legacy.h.
 */
#ifndef IPCC_LEGACY_IMPL_H
#define IPCC_LEGACY_IMPL_H

#include "legacy.h"

IPCC_HIDDEN void ipcc_legacy_close_untaken(const struct ipcc_legacy_victim *v, size_t n);
IPCC_HIDDEN int ipcc_legacy_close_pending(uint64_t ctx_id, uint64_t dptr);
IPCC_HIDDEN void ipcc_legacy_close_wait(uint64_t ctx_id, uint64_t dptr);
IPCC_HIDDEN size_t ipcc_legacy_close_wait_elsewhere(uint64_t keep_ctx_id);

#endif
