/*
 * budget.h - the one idle budget across both kinds: both tables, created
 * and reset together, their gauges and LRU order (budget_tables.c), and its
 * enforcement a batch at a time (idle_budget.c). What only those two files
 * share, the budget's LRU choice, is in budget_impl.h.
 */
#ifndef IPCC_BUDGET_H
#define IPCC_BUDGET_H

#include "tables.h"

/* ---- budget_tables.c: the layer below both kinds; the one idle budget ---- */

IPCC_HIDDEN int ipcc_budget_start(void);
/* The VMM table is made at the first import; the kind gives the file
 * comparisons its identities need (vmm_identity.c), since it sits above. */
IPCC_HIDDEN struct ipcc_vmm_table *ipcc_budget_vmm_start(ipcc_vmm_cmp_fn cmp,
                                                         ipcc_vmm_same_fn same);
IPCC_HIDDEN struct ipcc_legacy_table *ipcc_budget_legacy(void); /* NULL before start */
IPCC_HIDDEN struct ipcc_vmm_table *ipcc_budget_vmm(void);  /* NULL until an import */
IPCC_HIDDEN void ipcc_budget_fork_child(void);
IPCC_HIDDEN void ipcc_budget_gauges(struct ipcc_budget_gauges *out);
IPCC_HIDDEN void ipcc_budget_top(struct ipcc_top_slot *out);

IPCC_HIDDEN void ipcc_budget_room(uint64_t max_bytes, uint64_t max_entries, uint64_t *room_bytes,
                                  uint64_t *room_entries);

/* ---- idle_budget.c: the one budget, enforced for both kinds -------------------- */

/* What an eviction closes through: each kind's own closes, which sit above
 * the budget and are registered with it at load (entry/wiring.c). The
 * _taken ones run under the table lock, listing what the batch took as
 * being closed; the _run ones after unlocking, calling the driver. */
struct ipcc_budget_closers {
    void (*legacy_taken)(const struct ipcc_legacy_victim *v, size_t n);
    void (*legacy_run)(const struct ipcc_legacy_victim *v, size_t n, int evicted);
    void (*vmm_taken)(const struct ipcc_vmm_ops *ops);
    void (*vmm_run)(struct ipcc_vmm_ops *ops, int evicted);
};
IPCC_HIDDEN void ipcc_budget_register(const struct ipcc_budget_closers *c);

IPCC_HIDDEN void ipcc_budget_evict_over_caps(void);
IPCC_HIDDEN void ipcc_budget_evict_fds_over(size_t keep);
IPCC_HIDDEN void ipcc_budget_give_way_all(void);
IPCC_HIDDEN void ipcc_budget_release_all(void);

#endif
