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
struct ipcc_key {
    uint64_t ctx_id;
    uint32_t flags;
    uint32_t zero_pad;
    unsigned char handle[IPCC_HANDLE_BYTES];
    uint32_t hash;      /* of the bytes above, computed outside the lock */
    uint32_t zero_pad2;
};

struct ipcc_entry;

/* An entry removed from the table whose mapping the caller must really close
 * (eviction, exit) or forget (context gone). */
struct ipcc_victim {
    void *ctx;
    uint64_t ctx_id;
    uint64_t dptr;
    uint64_t bytes;
};

struct ipcc_cache;

IPCC_HIDDEN struct ipcc_cache *ipcc_cache_create(void);
IPCC_HIDDEN void ipcc_cache_destroy(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_cache_clear(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_key_init(struct ipcc_key *k, uint64_t ctx_id,
                               const void *handle, uint32_t flags);
IPCC_HIDDEN int ipcc_cache_acquire(struct ipcc_cache *c, const struct ipcc_key *k,
                                   uint64_t *dptr);
IPCC_HIDDEN int ipcc_cache_recent_is(uint64_t ctx_id, const void *handle, uint32_t flags);
IPCC_HIDDEN int ipcc_cache_acquire_recent(struct ipcc_cache *c, uint64_t *dptr);
/* Loans: entries lent to threads (legacy_loans.c, whose top comment tells
 * the protocol): their hits and closes of them take no lock. */
struct ipcc_cache_totals {
    uint64_t live, idle, idle_bytes;
};
IPCC_HIDDEN int ipcc_cache_recent_lendable(struct ipcc_cache *c);
IPCC_HIDDEN int ipcc_cache_lend_recent(struct ipcc_cache *c, uint64_t now_ns,
                                       uint64_t room_entries, uint64_t room_bytes);
IPCC_HIDDEN int ipcc_cache_open_lent(uint64_t ctx_id, const void *handle,
                                     uint32_t flags, uint64_t *dptr);
IPCC_HIDDEN int ipcc_cache_close_lent(uint64_t ctx_id, uint64_t dptr,
                                      uint64_t now_ns);
IPCC_HIDDEN void ipcc_cache_return_lent(struct ipcc_cache *c, int give_up);
IPCC_HIDDEN void ipcc_cache_lent_totals(uint64_t *entries, uint64_t *bytes);
IPCC_HIDDEN void ipcc_cache_gauges_now(const struct ipcc_cache *c, struct ipcc_cache_totals *out);
IPCC_HIDDEN void ipcc_cache_lent_fork_child(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_cache_recall_all(struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_cache_lent_floor(uint64_t now_ns);
IPCC_HIDDEN int ipcc_cache_has_lent(void);
IPCC_HIDDEN int ipcc_cache_insert(struct ipcc_cache *c, const struct ipcc_key *k,
                                  void *ctx, uint64_t dptr, uint64_t bytes,
                                  uint64_t now_ns, uint64_t *cached_dptr);
IPCC_HIDDEN enum ipcc_release_result ipcc_cache_release(struct ipcc_cache *c,
                                                        uint64_t ctx_id,
                                                        uint64_t dptr, uint64_t now_ns);
IPCC_HIDDEN int ipcc_cache_oldest_idle(const struct ipcc_cache *c, uint64_t *ns);
IPCC_HIDDEN size_t ipcc_cache_evict(struct ipcc_cache *c, uint64_t max_idle_bytes,
                                    uint64_t max_idle_entries,
                                    struct ipcc_victim *out, size_t cap);
IPCC_HIDDEN int ipcc_cache_over_caps(const struct ipcc_cache *c, uint64_t max_bytes,
                                     uint64_t max_entries);
IPCC_HIDDEN size_t ipcc_cache_evict_other_contexts(struct ipcc_cache *c, uint64_t keep_ctx_id,
                                                   struct ipcc_victim *out, size_t cap);
IPCC_HIDDEN size_t ipcc_cache_drop_ctx(struct ipcc_cache *c, uint64_t ctx_id,
                                       struct ipcc_victim *out, size_t cap);
IPCC_HIDDEN size_t ipcc_cache_contexts(struct ipcc_cache *c, void **ctxs,
                                       uint64_t *ids, size_t cap);
IPCC_HIDDEN size_t ipcc_cache_count(const struct ipcc_cache *c);

/* Totals the cache keeps; read by the signal handler, so atomic. */
struct ipcc_cache_gauges {
    _Atomic uint64_t live;
    _Atomic uint64_t idle;
    _Atomic uint64_t idle_bytes;
};
IPCC_HIDDEN const struct ipcc_cache_gauges *ipcc_cache_gauges(const struct ipcc_cache *c);

IPCC_HIDDEN const struct ipcc_top_slot *ipcc_cache_top(const struct ipcc_cache *c);
IPCC_HIDDEN void ipcc_cache_top_now(const struct ipcc_cache *c, struct ipcc_top_slot *out);

/* legacy_table.c: idle entries of one exporter's allocation, in any context. */
IPCC_HIDDEN size_t ipcc_cache_take_idle_by_handle(struct ipcc_cache *c, const void *handle,
                                                  struct ipcc_victim *out, size_t cap,
                                                  uint64_t *live_bytes);

#endif
