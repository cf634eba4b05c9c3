/*
 * budget_impl.h - what the budget's two files share, private to
 * shim/budget/: the LRU choice across both tables (budget_tables.c) that
 * the enforcement (idle_budget.c) takes its batches with. The budget's
 * interface is budget.h.
 */
#ifndef IPCC_BUDGET_IMPL_H
#define IPCC_BUDGET_IMPL_H

#include "budget.h"

/* What an eviction keeps to: the caps, or nothing at all (all). */
struct ipcc_budget {
    uint64_t max_bytes, max_entries;
    int all;
};
IPCC_HIDDEN int ipcc_budget_over(uint64_t max_bytes, uint64_t max_entries);
IPCC_HIDDEN size_t ipcc_budget_take_idle(const struct ipcc_budget *b,
                                         struct ipcc_legacy_victim *out, size_t cap,
                                         size_t *nout, struct ipcc_vmm_ops *ops);

#endif
