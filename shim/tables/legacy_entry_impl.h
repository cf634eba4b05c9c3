/*
 * legacy_entry_impl.h - the legacy table's data, which both its files
 * share: the entries, the table (indexes, LRU list, gauges, top slots), the
 * thread's memo of its last hit, and the small helpers that write them.
 * Neither file's: legacy_table.c uses legacy_loans.c (legacy_loans_impl.h),
 * never the other way, and both use this. Private to the folder; the
 * interface is legacy_table.h. The helpers are here, static, so that the
 * locked hit path compiles as it did in one file. legacy_table.c configures
 * uthash before it includes this header.
 */
#ifndef IPCC_LEGACY_ENTRY_IMPL_H
#define IPCC_LEGACY_ENTRY_IMPL_H

#include <string.h>

#include "legacy_table.h"

#include <uthash.h>

/* Not marked inline, so that the compiler weighs each helper as it did when
 * both files were one: the object code is the same. */
#define IPCC_TABLE_HELPER static __attribute__((unused))

struct ptr_key {
    uint64_t ctx_id;
    uint64_t dptr;
};

struct ipcc_alias;

struct ipcc_entry {
    struct ipcc_legacy_key key;
    struct ptr_key pkey;
    void *ctx;
    uint64_t bytes;
    uint64_t refs;                      /* the application's, all keys together;
                                         * while lent, those outside the slots */
    uint64_t idle_ns;                   /* when it last went idle; while lent,
                                         * the latest close of it seen so far */
    int top_slot;                       /* -1: not mirrored */
    uint64_t lent_to;                   /* bit i: lent to lent_slots[i]; 0: not lent */
    const void *last_user;              /* the thread of its last locked use */
    unsigned runs;                      /* locked uses in a row by that thread */
    unsigned taken_back;                /* loans taken back for another's close */
    unsigned doomed;                    /* its exporter freed it: the last close
                                         * really closes it; never lent */
    struct ipcc_entry *prev, *next;     /* LRU, only while idle */
    struct ipcc_alias *aliases;         /* other keys of this mapping */
    UT_hash_handle hh_key, hh_ptr;
};

/* Another key that the driver answered with an entry's mapping. */
struct ipcc_alias {
    struct ipcc_legacy_key key;
    struct ipcc_entry *entry;
    struct ipcc_alias *next;            /* the entry's next alias */
    UT_hash_handle hh;
};

struct ipcc_legacy_table {
    struct ipcc_entry *by_key;
    struct ipcc_entry *by_ptr;
    struct ipcc_alias *by_alias;
    struct ipcc_entry *lru;             /* head = least recently used */
    struct ipcc_legacy_gauges gauges;
    struct ipcc_top_slot top[IPCC_TOP_SLOTS];
};

/* ---- the calling thread's last hit (defined in legacy_loans.c) ----------- */

IPCC_HIDDEN extern uint64_t removed_gen;

struct ipcc_recent {
    const struct ipcc_legacy_table *c;
    struct ipcc_entry *e;
    uint64_t gen;
    uint64_t ctx_id;
    uint32_t flags;
    unsigned char handle[IPCC_HANDLE_BYTES];
};
/* Aligned as the one file had it, so that the memo is filled the same way. */
IPCC_HIDDEN extern __thread struct ipcc_recent recent
    __attribute__((tls_model("initial-exec"), aligned(16)));

/* The thread's last entry of c if it is still there (lock held). */
IPCC_TABLE_HELPER struct ipcc_entry *recent_entry(const struct ipcc_legacy_table *c)
{
    return recent.c == c && recent.gen == removed_gen ? recent.e : NULL;
}

/* ---- small helpers, both files ------------------------------------------ */

/* Gauges are written only under the table lock, so a plain load and store
 * suffice (no locked instruction on the hit path); atomics only so that the
 * signal handler may read them at any moment. */
IPCC_TABLE_HELPER void gauge_add(_Atomic uint64_t *g, uint64_t n)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

IPCC_TABLE_HELPER void gauge_sub(_Atomic uint64_t *g, uint64_t n)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) - n,
                          memory_order_relaxed);
}

static void slot_store(_Atomic uint64_t *f, uint64_t v)
{
    atomic_store_explicit(f, v, memory_order_relaxed);
}

IPCC_TABLE_HELPER void top_update(struct ipcc_legacy_table *c, const struct ipcc_entry *e, int hit)
{
    if (e->top_slot < 0)
        return;
    struct ipcc_top_slot *s = &c->top[e->top_slot];
    /* Writers hold the table lock; only the signal handler reads. */
    if (hit)
        slot_store(&s->hits, atomic_load_explicit(&s->hits, memory_order_relaxed) + 1);
    slot_store(&s->refs, e->refs);
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

#endif
