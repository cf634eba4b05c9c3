/*
 * legacy_table.h - the legacy kind's table (legacy_table.c, legacy_loans.c):
 * pure C, no CUDA, no I/O, no locking; its callers hold the table lock and
 * run the driver work it returns after unlocking.
 */
#ifndef IPCC_LEGACY_TABLE_H
#define IPCC_LEGACY_TABLE_H

#include "stats.h"

/* Identity of one mapping as the driver sees it. Zero-filled before use:
 * uthash hashes the raw bytes, padding included. */
struct ipcc_legacy_key {
    uint64_t ctx_id;
    uint32_t flags;
    uint32_t zero_pad;
    unsigned char handle[IPCC_HANDLE_BYTES];
    uint32_t hash;      /* of the bytes above, computed outside the lock */
    uint32_t zero_pad2;
};

/* An entry removed from the table whose mapping the caller must really close
 * (eviction, exit) or forget (context gone). */
struct ipcc_legacy_victim {
    void *ctx;
    uint64_t ctx_id;
    uint64_t dptr;
    uint64_t bytes;
    unsigned char handle[IPCC_HANDLE_BYTES]; /* its key's; zero when unknown */
};

/* Whether a mapping opened through handle is one the caller looks for; asked
 * under the caller's lock of each key of an entry (its aliases too). */
typedef int (*ipcc_legacy_handle_test)(const void *handle, void *arg);

struct ipcc_legacy_table;

IPCC_HIDDEN struct ipcc_legacy_table *ipcc_legacy_table_create(void);
IPCC_HIDDEN void ipcc_legacy_table_destroy(struct ipcc_legacy_table *c);
IPCC_HIDDEN void ipcc_legacy_table_clear(struct ipcc_legacy_table *c);
IPCC_HIDDEN void ipcc_legacy_key_init(struct ipcc_legacy_key *k, uint64_t ctx_id,
                                      const void *handle, uint32_t flags);
IPCC_HIDDEN int ipcc_legacy_find(struct ipcc_legacy_table *c, const struct ipcc_legacy_key *k,
                                 uint64_t *dptr);
IPCC_HIDDEN int ipcc_legacy_recent_is(uint64_t ctx_id, const void *handle, uint32_t flags);
IPCC_HIDDEN int ipcc_legacy_find_recent(struct ipcc_legacy_table *c, uint64_t *dptr);
/* Loans: entries lent to threads (legacy_loans.c, whose top comment tells
 * the protocol): their hits and closes of them take no lock. */
struct ipcc_legacy_totals {
    uint64_t live, idle, idle_bytes;
};
IPCC_HIDDEN int ipcc_legacy_loan_lendable(struct ipcc_legacy_table *c);
IPCC_HIDDEN int ipcc_legacy_loan_lend_recent(struct ipcc_legacy_table *c, uint64_t now_ns,
                                             uint64_t room_entries, uint64_t room_bytes);
IPCC_HIDDEN int ipcc_legacy_loan_open(uint64_t ctx_id, const void *handle,
                                      uint32_t flags, uint64_t *dptr);
IPCC_HIDDEN int ipcc_legacy_loan_close(uint64_t ctx_id, uint64_t dptr,
                                       uint64_t now_ns);
IPCC_HIDDEN void ipcc_legacy_loan_return(struct ipcc_legacy_table *c, int give_up);
IPCC_HIDDEN void ipcc_legacy_loan_totals(uint64_t *entries, uint64_t *bytes);
IPCC_HIDDEN void ipcc_legacy_gauges_now(const struct ipcc_legacy_table *c,
                                        struct ipcc_legacy_totals *out);
IPCC_HIDDEN void ipcc_legacy_loan_fork_child(struct ipcc_legacy_table *c);
IPCC_HIDDEN void ipcc_legacy_loan_recall_all(struct ipcc_legacy_table *c);
IPCC_HIDDEN void ipcc_legacy_loan_floor(uint64_t now_ns);
IPCC_HIDDEN int ipcc_legacy_loan_held(void);
IPCC_HIDDEN int ipcc_legacy_insert(struct ipcc_legacy_table *c, const struct ipcc_legacy_key *k,
                                   void *ctx, uint64_t dptr, uint64_t bytes,
                                   uint64_t now_ns, uint64_t *cached_dptr);
IPCC_HIDDEN enum ipcc_release_result ipcc_legacy_release(struct ipcc_legacy_table *c,
                                                         uint64_t ctx_id,
                                                         uint64_t dptr, uint64_t now_ns);
IPCC_HIDDEN int ipcc_legacy_oldest_idle(const struct ipcc_legacy_table *c, uint64_t *ns);
IPCC_HIDDEN size_t ipcc_legacy_evict(struct ipcc_legacy_table *c, uint64_t max_idle_bytes,
                                     uint64_t max_idle_entries,
                                     struct ipcc_legacy_victim *out, size_t cap);
IPCC_HIDDEN size_t ipcc_legacy_evict_other_contexts(struct ipcc_legacy_table *c,
                                                    uint64_t keep_ctx_id,
                                                    ipcc_legacy_handle_test in_the_way, void *arg,
                                                    struct ipcc_legacy_victim *out, size_t cap);
IPCC_HIDDEN size_t ipcc_legacy_drop_context(struct ipcc_legacy_table *c, uint64_t ctx_id,
                                            struct ipcc_legacy_victim *out, size_t cap);
IPCC_HIDDEN size_t ipcc_legacy_contexts(struct ipcc_legacy_table *c, void **ctxs,
                                        uint64_t *ids, size_t cap);
IPCC_HIDDEN size_t ipcc_legacy_table_entries(const struct ipcc_legacy_table *c);

/* Totals the cache keeps; read by the signal handler, so atomic. */
struct ipcc_legacy_gauges {
    _Atomic uint64_t live;
    _Atomic uint64_t idle;
    _Atomic uint64_t idle_bytes;
    _Atomic uint64_t doomed_bytes;      /* of entries in use whose exporter freed them */
};
IPCC_HIDDEN const struct ipcc_legacy_gauges *
ipcc_legacy_table_gauges(const struct ipcc_legacy_table *c);

IPCC_HIDDEN const struct ipcc_top_slot *ipcc_legacy_table_top(const struct ipcc_legacy_table *c);
IPCC_HIDDEN void ipcc_legacy_top_now(const struct ipcc_legacy_table *c, struct ipcc_top_slot *out);

/* legacy_table.c: idle entries of one exporter's allocation, in any context,
 * under any of the handles it was opened with; those in use are doomed
 * (their last ipcc_legacy_release answers IPCC_RELEASE_LAST). */
IPCC_HIDDEN size_t ipcc_legacy_take_idle_by_handle(struct ipcc_legacy_table *c, const void *handle,
                                                   struct ipcc_legacy_victim *out, size_t cap);

#endif
