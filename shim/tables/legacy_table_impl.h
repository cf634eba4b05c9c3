/*
 * legacy_table_impl.h - what the legacy table's files share (legacy_table.c:
 * the table, its indexes, memo and LRU list; legacy_loans.c: the entries
 * lent to threads). Private to the folder; the interface is legacy_table.h.
 * The helpers both use on the locked hit path are here, static, so that
 * path compiles as it did in one file. legacy_table.c configures uthash
 * before it includes this header.
 */
#ifndef IPCC_LEGACY_TABLE_IMPL_H
#define IPCC_LEGACY_TABLE_IMPL_H

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

/* ---- the calling thread's last hit (legacy_table.c) --------------------- */

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

/* ---- entries lent to threads (legacy_loans.c, whose top comment tells the
 * protocol) ---------------------------------------------------------------- */

#define LENT_SLOTS 64
#define LENT (1ULL << 63)               /* state: an entry is lent */
#define LENT_HIT (1ULL << 32)           /* state: one hit of the owner's */
#define LENT_HITS (LENT - LENT_HIT)     /* state: the owner's hits since lent */
#define LENT_REFS (LENT_HIT - 1)        /* state: the owner's references */

_Static_assert(LENT_SLOTS <= 64, "lent_to has a bit per slot");

/* Written by its owner (state, last_close_ns) and, lock held, by the table;
 * everything atomic so that the signal handler may read it. */
struct lent_slot {
    _Atomic uint64_t state;
    _Atomic uint64_t last_close_ns;     /* the owner's, for the LRU order */
    _Atomic uint64_t base_refs;         /* mirror of the entry's e->refs */
    _Atomic uint64_t bytes;
    _Atomic(const struct ipcc_legacy_table *) cache;
    _Atomic(struct ipcc_entry *) entry; /* followed with the lock only */
    _Atomic int top;                    /* the entry's top slot; -1: none */
    _Atomic int taken;                  /* by a thread, for its life */
} __attribute__((aligned(128))); /* a pair of lines: processors fetch lines in pairs */

IPCC_HIDDEN extern struct lent_slot lent_slots[LENT_SLOTS];
IPCC_HIDDEN extern _Atomic uint64_t lent_count, lent_bytes;  /* written under the lock */

/* The calling thread's slot and what it was lent: read without the lock. */
struct ipcc_lent_tls {
    struct lent_slot *slot;
    uint64_t ctx_id, dptr;
    uint64_t floor_ns; /* the thread's latest precise stamp: its lent closes come after */
    uint32_t flags;
    unsigned char handle[IPCC_HANDLE_BYTES];
};
IPCC_HIDDEN extern __thread struct ipcc_lent_tls lent __attribute__((tls_model("initial-exec")));

IPCC_HIDDEN void recall(struct ipcc_legacy_table *c, struct lent_slot *s);
IPCC_HIDDEN void recall_all(struct ipcc_legacy_table *c);

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

IPCC_TABLE_HELPER uint64_t slot_bit(const struct lent_slot *s)
{
    return 1ULL << (s - lent_slots);
}

/* Lock held: the signal handler learns e's references outside the slots. */
IPCC_TABLE_HELPER void mirror_outside_refs(const struct ipcc_entry *e)
{
    for (uint64_t m = e->lent_to; m; m &= m - 1)
        slot_store(&lent_slots[__builtin_ctzll(m)].base_refs, e->refs);
}

/* Lock held: every loan of e comes back. */
IPCC_TABLE_HELPER void recall_entry(struct ipcc_legacy_table *c, struct ipcc_entry *e)
{
    while (e && e->lent_to)
        recall(c, &lent_slots[__builtin_ctzll(e->lent_to)]);
}

/* Lock held: this thread uses e on the locked path; counts its uses in a
 * row, by which lendable() decides. */
IPCC_TABLE_HELPER void note_use(struct ipcc_entry *e)
{
    const void *me = &lent;
    if (!e)
        return;
    e->runs = e->last_user == me ? e->runs + (e->runs < 255) : 1;
    e->last_user = me;
}

/* Each time loans of e were taken back for another thread's close doubles
 * the locked uses in a row by one thread it needs before it is lent again. */
#define MAX_TAKEN_BACK 6

IPCC_TABLE_HELPER int lendable(const struct ipcc_entry *e)
{
    return e->refs > 0 && !e->doomed && e->runs > (1u << e->taken_back) - 1;
}

/* Lock held: a close found no reference of e outside the slots: it closes
 * another thread's (or none, past zero): every loan of e comes back, so the
 * exact count answers. */
IPCC_TABLE_HELPER void take_back_for_close(struct ipcc_legacy_table *c, struct ipcc_entry *e)
{
    if (e->lent_to & ~(lent.slot ? slot_bit(lent.slot) : 0)) {
        e->last_user = NULL;
        if (e->taken_back < MAX_TAKEN_BACK)
            e->taken_back++;
    }
    recall_entry(c, e);
}

/* A precise time of something this thread just did: see ipcc_legacy_loan_floor. */
IPCC_TABLE_HELPER void lent_floor(uint64_t now_ns)
{
    lent.floor_ns = max_u64(lent.floor_ns, now_ns);
}

#endif
