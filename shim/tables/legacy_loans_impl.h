/*
 * legacy_loans_impl.h - legacy_loans.c's interface to legacy_table.c: the
 * lent slots (the protocol is legacy_loans.c's top comment), recall, and
 * the helpers by which the table's locked paths keep loans right. One way:
 * the table uses the loans; the loans use only the entries' data
 * (legacy_entry_impl.h), nothing of legacy_table.c's.
 */
#ifndef IPCC_LEGACY_LOANS_IMPL_H
#define IPCC_LEGACY_LOANS_IMPL_H

#include "legacy_entry_impl.h"

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

/* ---- helpers of the locked paths ----------------------------------------- */

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
