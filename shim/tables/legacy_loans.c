/*
 * legacy_loans.c - entries of the legacy table lent to threads: their hits
 * need no lock.
 *
 * A thread that hits an entry may be lent it: from then on its opens and
 * closes of that entry count references in its lent slot with one atomic
 * operation on a line no other thread writes, without the lock, the hash or
 * the table. Several threads may be lent one entry at once, a slot each
 * (lent_to: which), so threads sharing a handle all hit without the lock.
 * The entry's other references (taken under the lock by threads it is not
 * lent to) stay in e->refs, mirrored into each of its slots (base_refs) for
 * the signal handler. While lent to any thread the entry is off the table's
 * books (the exact gauges and the LRU list), counted once in lent_count.
 *
 * Recalling one slot swaps its state to 0, so its owner's next atomic
 * operation fails and it takes the locked path; the slot's references fold
 * into e->refs and its latest close into e->idle_ns; the last slot's recall
 * puts the entry back on the books. A slot is recalled when its thread is
 * lent another entry, exits, or makes a call whose order against its closes
 * matters. Whoever needs the exact count under the lock recalls every slot
 * of the entry first: a close that finds no reference outside the slots
 * (another thread's reference, or past zero), an eviction, a teardown, the
 * exporter's let-go, fork. Such a close takes loans back for another
 * thread's reference, and each time it does, the entry needs twice the
 * locked uses in a row by one thread (up to 64) before it is lent again, so
 * threads that keep closing each other's references share it on the locked
 * path instead of recalling at every call.
 *
 * Slots are static, so neither an owner nor the signal handler ever touches
 * freed memory; the handler reads slots and atomics only, never an entry.
 * The idle budget holds without looking at each lent close: an entry is lent
 * only when the budget has room for it idle (the caller checks; lending it
 * to one more thread needs none), and every budget check counts lent entries
 * as idle (ipcc_legacy_loan_totals).
 */
#include "legacy_loans_impl.h"
#include <utlist.h>

struct lent_slot lent_slots[LENT_SLOTS];
_Atomic uint64_t lent_count, lent_bytes;  /* written under the lock */

__thread struct ipcc_lent_tls lent __attribute__((tls_model("initial-exec")));

/* The thread's memo of its last hit (legacy_table.c), here because a loan
 * is made of it and this file uses nothing of legacy_table.c's. */
uint64_t removed_gen;
__thread struct ipcc_recent recent __attribute__((tls_model("initial-exec")));

/* Idle entries join the LRU list by the time they went idle: a recalled one
 * may have gone idle before others already there. */
static void lru_insert(struct ipcc_legacy_table *c, struct ipcc_entry *e)
{
    struct ipcc_entry *after = c->lru ? c->lru->prev : NULL; /* the tail */
    while (after && after->idle_ns > e->idle_ns)
        after = after == c->lru ? NULL : after->prev;
    if (after)
        DL_APPEND_ELEM(c->lru, after, e);
    else
        DL_PREPEND(c->lru, e);
}

static struct ipcc_entry *slot_entry(const struct lent_slot *s)
{
    return atomic_load_explicit(&s->entry, memory_order_relaxed);
}

/* Lock held: e, lent to its first thread, leaves the table's books: it
 * holds a reference (the one just taken), so it was live. */
static void take_off_books(struct ipcc_entry *e, struct ipcc_legacy_table *c, uint64_t now_ns)
{
    gauge_sub(&c->gauges.live, 1);
    gauge_add(&lent_count, 1);
    gauge_add(&lent_bytes, e->bytes);
    e->idle_ns = now_ns;
}

/* Lock held: e's last loan came back; it is live or idle again. */
static void put_back_on_books(struct ipcc_legacy_table *c, struct ipcc_entry *e)
{
    gauge_sub(&lent_count, 1);
    gauge_sub(&lent_bytes, e->bytes);
    if (e->refs == 0) {
        lru_insert(c, e);
        gauge_add(&c->gauges.idle, 1);
        gauge_add(&c->gauges.idle_bytes, e->bytes);
    } else {
        gauge_add(&c->gauges.live, 1);
    }
}

static void top_add_hits(struct ipcc_legacy_table *c, const struct ipcc_entry *e, uint64_t hits)
{
    if (e->top_slot < 0 || hits == 0)
        return;
    struct ipcc_top_slot *t = &c->top[e->top_slot];
    slot_store(&t->hits, atomic_load_explicit(&t->hits, memory_order_relaxed) + hits);
}

/* Lock held: one thread's loan comes back; its references and hits fold
 * into the entry's. */
void recall(struct ipcc_legacy_table *c, struct lent_slot *s)
{
    uint64_t st = atomic_exchange_explicit(&s->state, 0, memory_order_acq_rel);
    if (!(st & LENT))
        return;
    struct ipcc_entry *e = slot_entry(s);
    atomic_store_explicit(&s->entry, NULL, memory_order_relaxed);
    e->lent_to &= ~slot_bit(s);
    e->refs += st & LENT_REFS;
    e->idle_ns = max_u64(e->idle_ns, atomic_load_explicit(&s->last_close_ns, memory_order_relaxed));
    top_add_hits(c, e, (st & LENT_HITS) / LENT_HIT);
    if (e->lent_to)
        mirror_outside_refs(e);
    else
        put_back_on_books(c, e);
    top_update(c, e, 0);
}

/* Lock held: every entry of c lent to any thread comes back. */
void recall_all(struct ipcc_legacy_table *c)
{
    if (atomic_load_explicit(&lent_count, memory_order_relaxed) == 0)
        return;
    for (int i = 0; i < LENT_SLOTS; i++)
        if (atomic_load_explicit(&lent_slots[i].cache, memory_order_relaxed) == c)
            recall(c, &lent_slots[i]);
}

/* The calling thread's slot, taken the first time; NULL when all are taken. */
static struct lent_slot *my_slot(void)
{
    if (lent.slot)
        return lent.slot;
    for (int i = 0; i < LENT_SLOTS; i++) {
        int free_slot = 0;
        if (atomic_compare_exchange_strong(&lent_slots[i].taken, &free_slot, 1))
            return lent.slot = &lent_slots[i];
    }
    return NULL;
}

/* Lock held: whether this thread's last hit could be lent it, budget aside. */
int ipcc_legacy_loan_lendable(struct ipcc_legacy_table *c)
{
    struct ipcc_entry *e = recent_entry(c);
    return e && lendable(e);
}

/* Lock held: slot s of this thread holds e from now on, with one reference
 * of e's (the one this thread just took). */
static void lend_to_slot(struct ipcc_legacy_table *c, struct ipcc_entry *e, struct lent_slot *s,
                         uint64_t now_ns)
{
    if (!e->lent_to)
        take_off_books(e, c, now_ns);
    e->refs--;
    e->lent_to |= slot_bit(s);
    atomic_store_explicit(&s->entry, e, memory_order_relaxed);
    atomic_store_explicit(&s->cache, c, memory_order_relaxed);
    atomic_store_explicit(&s->bytes, e->bytes, memory_order_relaxed);
    atomic_store_explicit(&s->last_close_ns, now_ns, memory_order_relaxed);
    atomic_store_explicit(&s->top, e->top_slot, memory_order_relaxed);
    mirror_outside_refs(e);
    top_update(c, e, 0);
}

/*
 * Lock held, right after this thread's hit or insert of an entry (its
 * memo): lends that entry to the thread, the reference just taken being the
 * thread's own, if the idle budget has room for it (room_entries, room_bytes:
 * what the caps leave, counting what is lent as idle) or it is lent already
 * (to other threads: counted once). The thread's previous loan comes back
 * first. Returns 1 when lent.
 */
int ipcc_legacy_loan_lend_recent(struct ipcc_legacy_table *c, uint64_t now_ns,
                                 uint64_t room_entries, uint64_t room_bytes)
{
    struct ipcc_entry *e = recent_entry(c);
    if (!e || !lendable(e))
        return 0;
    if (!e->lent_to && (room_entries < 1 || room_bytes < e->bytes))
        return 0;
    struct lent_slot *s = my_slot();
    if (!s)
        return 0;
    const struct ipcc_legacy_table *had = atomic_load_explicit(&s->cache, memory_order_relaxed);
    if (had == c)
        recall(c, s);
    else if (had && (atomic_load(&s->state) & LENT))
        return 0; /* lent from another table (unit tests only): keep it */
    lend_to_slot(c, e, s, now_ns);
    lent.ctx_id = e->key.ctx_id;
    lent.flags = recent.flags;
    memcpy(lent.handle, recent.handle, IPCC_HANDLE_BYTES);
    lent.dptr = e->pkey.dptr;
    ipcc_legacy_loan_floor(now_ns);
    atomic_store_explicit(&s->state, LENT | 1, memory_order_release);
    return 1;
}

/* No lock: an open of what this thread was lent takes one of its own
 * references and counts its hit, both in its slot's state. 1 and *dptr
 * set, or 0: the locked path must answer. */
int ipcc_legacy_loan_open(uint64_t ctx_id, const void *handle, uint32_t flags, uint64_t *dptr)
{
    struct lent_slot *s = lent.slot;
    if (!s || lent.ctx_id != ctx_id || lent.flags != flags ||
        memcmp(lent.handle, handle, IPCC_HANDLE_BYTES) != 0)
        return 0;
    uint64_t st = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (!(st & LENT) || (st & LENT_REFS) == LENT_REFS || (st & LENT_HITS) == LENT_HITS ||
        !atomic_compare_exchange_strong_explicit(&s->state, &st, st + LENT_HIT + 1,
                                                 memory_order_acq_rel, memory_order_relaxed))
        return 0;
    *dptr = lent.dptr;
    return 1;
}

/* No lock: a close of what this thread was lent, while it holds a reference
 * of its own there; 0 otherwise (the locked path answers: another thread's
 * reference, a close past zero). */
int ipcc_legacy_loan_close(uint64_t ctx_id, uint64_t dptr, uint64_t now_ns)
{
    struct lent_slot *s = lent.slot;
    if (!s || lent.dptr != dptr || lent.ctx_id != ctx_id)
        return 0;
    uint64_t st = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (!(st & LENT) || (st & LENT_REFS) == 0)
        return 0;
    /* Before the exchange, so that a recall sees it. */
    atomic_store_explicit(&s->last_close_ns, max_u64(now_ns, lent.floor_ns), memory_order_relaxed);
    return atomic_compare_exchange_strong_explicit(&s->state, &st, st - 1, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

/* Lock held: the calling thread's loan comes back (it exits, or makes a
 * call whose order against its closes matters); its slot too, with give_up. */
void ipcc_legacy_loan_return(struct ipcc_legacy_table *c, int give_up)
{
    struct lent_slot *s = lent.slot;
    if (!s)
        return;
    if (atomic_load_explicit(&s->cache, memory_order_relaxed) == c)
        recall(c, s);
    if (give_up) {
        atomic_store(&s->cache, NULL);
        atomic_store(&s->taken, 0);
        lent.slot = NULL;
    }
}

/* A precise time of something this thread just did (a locked close, a
 * lend, a VMM call that may leave something idle): its lent closes from now
 * on are ordered after it, though their own clock is coarse. */
void ipcc_legacy_loan_floor(uint64_t now_ns)
{
    lent_floor(now_ns);
}

/* Whether this thread has an entry lent (one load). */
int ipcc_legacy_loan_held(void)
{
    return lent.slot && (atomic_load_explicit(&lent.slot->state, memory_order_relaxed) & LENT);
}

/* What is lent now, all tables together: counted as idle by every budget
 * check. Async-signal-safe. */
void ipcc_legacy_loan_totals(uint64_t *entries, uint64_t *bytes)
{
    *entries = atomic_load_explicit(&lent_count, memory_order_relaxed);
    *bytes = atomic_load_explicit(&lent_bytes, memory_order_relaxed);
}

/* Whether slot i is lent an entry of c: its state then, or 0. */
static uint64_t lent_state(const struct ipcc_legacy_table *c, int i)
{
    const struct lent_slot *s = &lent_slots[i];
    uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    return (st & LENT) && atomic_load_explicit(&s->cache, memory_order_relaxed) == c ? st : 0;
}

/* The references of the entry lent to slot i, if i is the first slot that
 * holds it (so that a shared entry counts once): 1 and *refs set, else 0.
 * Compares entry addresses, never follows one. Async-signal-safe. */
static int lent_entry_refs(const struct ipcc_legacy_table *c, int i, uint64_t st, uint64_t *refs)
{
    const struct ipcc_entry *e = slot_entry(&lent_slots[i]);
    *refs = atomic_load_explicit(&lent_slots[i].base_refs, memory_order_relaxed) + (st & LENT_REFS);
    for (int j = 0; j < LENT_SLOTS; j++) {
        uint64_t other = j == i ? 0 : lent_state(c, j);
        if (!other || slot_entry(&lent_slots[j]) != e)
            continue;
        if (j < i)
            return 0;
        *refs += other & LENT_REFS;
    }
    return 1;
}

/* The gauges as the program would see them, lent entries counted live or
 * idle by their references at this moment, once however many threads hold
 * them (fields may be momentarily inconsistent). Async-signal-safe: static
 * slots and atomics only. */
void ipcc_legacy_gauges_now(const struct ipcc_legacy_table *c, struct ipcc_legacy_totals *out)
{
    out->live = atomic_load_explicit(&c->gauges.live, memory_order_relaxed);
    out->idle = atomic_load_explicit(&c->gauges.idle, memory_order_relaxed);
    out->idle_bytes = atomic_load_explicit(&c->gauges.idle_bytes, memory_order_relaxed);
    if (atomic_load_explicit(&lent_count, memory_order_relaxed) == 0)
        return;
    for (int i = 0; i < LENT_SLOTS; i++) {
        uint64_t st = lent_state(c, i), refs;
        if (!st || !lent_entry_refs(c, i, st, &refs))
            continue;
        if (refs > 0) {
            out->live++;
        } else {
            out->idle++;
            out->idle_bytes += atomic_load_explicit(&lent_slots[i].bytes, memory_order_relaxed);
        }
    }
}

/* The top slots as the program would see them: the mirror, plus the hits
 * and references the entries' loans count (top slots with used 0 are
 * free). Async-signal-safe: static slots and atomics only. */
void ipcc_legacy_top_now(const struct ipcc_legacy_table *c, struct ipcc_top_slot *out)
{
    for (int i = 0; i < IPCC_TOP_SLOTS; i++) {
        const struct ipcc_top_slot *t = &c->top[i];
        atomic_store_explicit(&out[i].used, atomic_load_explicit(&t->used, memory_order_acquire),
                              memory_order_relaxed);
        slot_store(&out[i].ctx_id, atomic_load_explicit(&t->ctx_id, memory_order_relaxed));
        slot_store(&out[i].hits, atomic_load_explicit(&t->hits, memory_order_relaxed));
        slot_store(&out[i].refs, atomic_load_explicit(&t->refs, memory_order_relaxed));
        slot_store(&out[i].bytes, atomic_load_explicit(&t->bytes, memory_order_relaxed));
        slot_store(&out[i].created_ns, atomic_load_explicit(&t->created_ns, memory_order_relaxed));
    }
    if (atomic_load_explicit(&lent_count, memory_order_relaxed) == 0)
        return;
    for (int i = 0; i < LENT_SLOTS; i++) {
        uint64_t st = lent_state(c, i);
        int top = atomic_load_explicit(&lent_slots[i].top, memory_order_relaxed);
        if (!st || top < 0 || top >= IPCC_TOP_SLOTS)
            continue;
        slot_store(&out[top].hits, atomic_load_explicit(&out[top].hits, memory_order_relaxed) +
                                       (st & LENT_HITS) / LENT_HIT);
        slot_store(&out[top].refs, atomic_load_explicit(&out[top].refs, memory_order_relaxed) +
                                       (st & LENT_REFS));
    }
}

/* Lock held: every loan of c comes back (an eviction compares idle times). */
void ipcc_legacy_loan_recall_all(struct ipcc_legacy_table *c)
{
    recall_all(c);
}

/* Fork child: the other threads and their loans are gone; this thread
 * forgets its slot. The table is cleared after. */
void ipcc_legacy_loan_fork_child(struct ipcc_legacy_table *c)
{
    if (c)
        recall_all(c);
    for (int i = 0; i < LENT_SLOTS; i++) {
        atomic_store(&lent_slots[i].state, 0);
        atomic_store(&lent_slots[i].cache, NULL);
        atomic_store(&lent_slots[i].taken, 0);
    }
    atomic_store(&lent_count, 0);
    atomic_store(&lent_bytes, 0);
    lent.slot = NULL;
}
