/*
 * legacy_table.c - the table of cached IPC mappings.
 *
 * Pure data structure: no CUDA, no I/O, no locking (the caller holds the one
 * lock, except for the calls on an entry lent to the calling thread, which
 * need none: see "entries lent to threads"). Two indexes over the same
 * entries, both uthash:
 *   by_key  (context id, handle, flags) -> entry   used by opens
 *   by_ptr  (context id, device pointer) -> entry  used by closes
 * One entry per mapping, holding exactly one driver reference. When the
 * driver returns a mapping we hold for a second handle byte string (two
 * exports of one allocation), that key becomes an alias of the entry
 * (by_alias), looked up only when by_key misses.
 * Entries with no reference sit on an LRU list (oldest first) so that
 * eviction closes the mapping idle the longest.
 *
 * Out of memory is never fatal: insert() fails and the caller simply does
 * not cache that mapping.
 */
#include <stdlib.h>
#include <string.h>

#include "legacy_table.h"

/* uthash must not abort the process on allocation failure: it leaves the
 * element out and raises this flag instead (read under the caller's lock). */
static int ipcc_cache_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (ipcc_cache_oom = 1)

/* Both key types are whole 8-byte words; a multiply-xorshift per word is a
 * few times cheaper than uthash's default on an 80-byte key, and the hit
 * path is all about such nanoseconds. */
static uint32_t hash_words(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ len;
    for (size_t i = 0; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    return (uint32_t)(h ^ (h >> 29));
}
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = hash_words((keyptr), (keylen)))

#include <uthash.h>
#include <utlist.h>

struct ptr_key {
    uint64_t ctx_id;
    uint64_t dptr;
};

/* The identity part of a key: everything before its cached hash. */
#define KEY_BYTES offsetof(struct ipcc_key, hash)

_Static_assert(KEY_BYTES % 8 == 0, "hash_words reads whole words");
_Static_assert(sizeof(struct ptr_key) % 8 == 0, "hash_words reads whole words");

struct ipcc_alias;

struct ipcc_entry {
    struct ipcc_key key;
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
    struct ipcc_entry *prev, *next;     /* LRU, only while idle */
    struct ipcc_alias *aliases;         /* other keys of this mapping */
    UT_hash_handle hh_key, hh_ptr;
};

/* Another key that the driver answered with an entry's mapping. */
struct ipcc_alias {
    struct ipcc_key key;
    struct ipcc_entry *entry;
    struct ipcc_alias *next;            /* the entry's next alias */
    UT_hash_handle hh;
};

struct ipcc_cache {
    struct ipcc_entry *by_key;
    struct ipcc_entry *by_ptr;
    struct ipcc_alias *by_alias;
    struct ipcc_entry *lru;             /* head = least recently used */
    struct ipcc_cache_gauges gauges;
    struct ipcc_top_slot top[IPCC_TOP_SLOTS];
};

/* ---- the calling thread's last hit -------------------------------------- */

/*
 * A thread that opens and closes one handle again and again finds its entry
 * here, without hashing the key or searching either index. The memo is the
 * thread's own; it is used only under the caller's lock, and only while no
 * entry has left a table since it was taken (removed_gen): an entry freed
 * since may lie at the same address.
 */
static uint64_t removed_gen;

static __thread struct {
    const struct ipcc_cache *c;
    struct ipcc_entry *e;
    uint64_t gen;
    uint64_t ctx_id;
    uint32_t flags;
    unsigned char handle[IPCC_HANDLE_BYTES];
} recent __attribute__((tls_model("initial-exec")));

static void remember_recent(const struct ipcc_cache *c, struct ipcc_entry *e,
                            const struct ipcc_key *k)
{
    recent.c = c;
    recent.e = e;
    recent.gen = removed_gen;
    recent.ctx_id = k->ctx_id;
    recent.flags = k->flags;
    memcpy(recent.handle, k->handle, IPCC_HANDLE_BYTES);
}

/* The thread's last entry of c if it is still there (lock held). */
static struct ipcc_entry *recent_entry(const struct ipcc_cache *c)
{
    return recent.c == c && recent.gen == removed_gen ? recent.e : NULL;
}

/* ---- entries lent to threads: their hits need no lock ------------------ */

/*
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
 * as idle (ipcc_cache_lent_totals).
 */
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
    _Atomic(const struct ipcc_cache *) cache;
    _Atomic(struct ipcc_entry *) entry; /* followed with the lock only */
    _Atomic int top;                    /* the entry's top slot; -1: none */
    _Atomic int taken;                  /* by a thread, for its life */
} __attribute__((aligned(128))); /* a pair of lines: processors fetch lines in pairs */

static struct lent_slot lent_slots[LENT_SLOTS];
static _Atomic uint64_t lent_count, lent_bytes;  /* written under the lock */

/* The calling thread's slot and what it was lent: read without the lock. */
static __thread struct {
    struct lent_slot *slot;
    uint64_t ctx_id, dptr;
    uint64_t floor_ns; /* the thread's latest precise stamp: its lent closes come after */
    uint32_t flags;
    unsigned char handle[IPCC_HANDLE_BYTES];
} lent __attribute__((tls_model("initial-exec")));

/* ---- small helpers ------------------------------------------------------ */

/* Gauges are written only under the table lock, so a plain load and store
 * suffice (no locked instruction on the hit path); atomics only so that the
 * signal handler may read them at any moment. */
static void gauge_add(_Atomic uint64_t *g, uint64_t n)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

static void gauge_sub(_Atomic uint64_t *g, uint64_t n)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) - n,
                          memory_order_relaxed);
}

static void slot_store(_Atomic uint64_t *f, uint64_t v)
{
    atomic_store_explicit(f, v, memory_order_relaxed);
}

/* Mirror an entry into a free top slot, if any is left. */
static void top_attach(struct ipcc_cache *c, struct ipcc_entry *e, uint64_t now_ns)
{
    e->top_slot = -1;
    for (int i = 0; i < IPCC_TOP_SLOTS; i++) {
        struct ipcc_top_slot *s = &c->top[i];
        if (atomic_load_explicit(&s->used, memory_order_relaxed))
            continue;
        slot_store(&s->ctx_id, e->key.ctx_id);
        slot_store(&s->hits, 0);
        slot_store(&s->refs, e->refs);
        slot_store(&s->bytes, e->bytes);
        slot_store(&s->created_ns, now_ns);
        atomic_store_explicit(&s->used, 1, memory_order_release);
        e->top_slot = i;
        return;
    }
}

static void top_detach(struct ipcc_cache *c, struct ipcc_entry *e)
{
    if (e->top_slot >= 0)
        atomic_store_explicit(&c->top[e->top_slot].used, 0, memory_order_release);
    e->top_slot = -1;
}

static void top_update(struct ipcc_cache *c, const struct ipcc_entry *e, int hit)
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

/* Idle entries join the LRU list by the time they went idle: a recalled one
 * may have gone idle before others already there. */
static void lru_insert(struct ipcc_cache *c, struct ipcc_entry *e)
{
    struct ipcc_entry *after = c->lru ? c->lru->prev : NULL; /* the tail */
    while (after && after->idle_ns > e->idle_ns)
        after = after == c->lru ? NULL : after->prev;
    if (after)
        DL_APPEND_ELEM(c->lru, after, e);
    else
        DL_PREPEND(c->lru, e);
}

static uint64_t slot_bit(const struct lent_slot *s)
{
    return 1ULL << (s - lent_slots);
}

static struct ipcc_entry *slot_entry(const struct lent_slot *s)
{
    return atomic_load_explicit(&s->entry, memory_order_relaxed);
}

/* Lock held: the signal handler learns e's references outside the slots. */
static void mirror_outside_refs(const struct ipcc_entry *e)
{
    for (uint64_t m = e->lent_to; m; m &= m - 1)
        slot_store(&lent_slots[__builtin_ctzll(m)].base_refs, e->refs);
}

/* Lock held: e, lent to its first thread, leaves the table's books: it
 * holds a reference (the one just taken), so it was live. */
static void take_off_books(struct ipcc_entry *e, struct ipcc_cache *c, uint64_t now_ns)
{
    gauge_sub(&c->gauges.live, 1);
    gauge_add(&lent_count, 1);
    gauge_add(&lent_bytes, e->bytes);
    e->idle_ns = now_ns;
}

/* Lock held: e's last loan came back; it is live or idle again. */
static void put_back_on_books(struct ipcc_cache *c, struct ipcc_entry *e)
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

static void top_add_hits(struct ipcc_cache *c, const struct ipcc_entry *e, uint64_t hits)
{
    if (e->top_slot < 0 || hits == 0)
        return;
    struct ipcc_top_slot *t = &c->top[e->top_slot];
    slot_store(&t->hits, atomic_load_explicit(&t->hits, memory_order_relaxed) + hits);
}

/* Lock held: one thread's loan comes back; its references and hits fold
 * into the entry's. */
static void recall(struct ipcc_cache *c, struct lent_slot *s)
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

/* Lock held: every loan of e comes back. */
static void recall_entry(struct ipcc_cache *c, struct ipcc_entry *e)
{
    while (e && e->lent_to)
        recall(c, &lent_slots[__builtin_ctzll(e->lent_to)]);
}

/* Lock held: this thread uses e on the locked path; counts its uses in a
 * row, by which lendable() decides. */
static void note_use(struct ipcc_entry *e)
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

static int lendable(const struct ipcc_entry *e)
{
    return e->refs > 0 && e->runs > (1u << e->taken_back) - 1;
}

/* Lock held: a close found no reference of e outside the slots: it closes
 * another thread's (or none, past zero): every loan of e comes back, so the
 * exact count answers. */
static void take_back_for_close(struct ipcc_cache *c, struct ipcc_entry *e)
{
    if (e->lent_to & ~(lent.slot ? slot_bit(lent.slot) : 0)) {
        e->last_user = NULL;
        if (e->taken_back < MAX_TAKEN_BACK)
            e->taken_back++;
    }
    recall_entry(c, e);
}

/* Lock held: every entry of c lent to any thread comes back. */
static void recall_all(struct ipcc_cache *c)
{
    if (atomic_load_explicit(&lent_count, memory_order_relaxed) == 0)
        return;
    for (int i = 0; i < LENT_SLOTS; i++)
        if (atomic_load_explicit(&lent_slots[i].cache, memory_order_relaxed) == c)
            recall(c, &lent_slots[i]);
}

/* Take an entry off every index and the gauges, freeing its aliases; the
 * caller frees the entry. */
static void unlink_entry(struct ipcc_cache *c, struct ipcc_entry *e)
{
    recall_entry(c, e);
    removed_gen++; /* every thread's memo of a hit is stale now */
    HASH_DELETE(hh_key, c->by_key, e);
    HASH_DELETE(hh_ptr, c->by_ptr, e);
    while (e->aliases) {
        struct ipcc_alias *a = e->aliases;
        e->aliases = a->next;
        HASH_DELETE(hh, c->by_alias, a);
        ipcc_mem_free(a);
    }
    if (e->refs == 0) {
        DL_DELETE(c->lru, e);
        gauge_sub(&c->gauges.idle, 1);
        gauge_sub(&c->gauges.idle_bytes, e->bytes);
    } else {
        gauge_sub(&c->gauges.live, 1);
    }
    top_detach(c, e);
}

/* Removes and frees an entry, describing it in out[*n] while there is room;
 * counts it in *n either way. */
static void remove_entry(struct ipcc_cache *c, struct ipcc_entry *e,
                         struct ipcc_victim *out, size_t cap, size_t *n)
{
    if (out && *n < cap) {
        struct ipcc_victim *v = &out[*n];
        v->ctx = e->ctx;
        v->ctx_id = e->key.ctx_id;
        v->dptr = e->pkey.dptr;
        v->bytes = e->bytes;
    }
    (*n)++;
    unlink_entry(c, e);
    ipcc_mem_free(e);
}

/* ---- API ---------------------------------------------------------------- */

/* Returns an empty table, or NULL when out of memory. */
struct ipcc_cache *ipcc_cache_create(void)
{
    /* Aligned as its mirror slots are, a line each. */
    struct ipcc_cache *c = aligned_alloc(_Alignof(struct ipcc_cache), sizeof(struct ipcc_cache));
    if (c)
        memset(c, 0, sizeof(*c));
    return c;
}

/* Forgets every entry without closing anything: for the fork child, whose
 * mappings belong to its parent's contexts. The table itself stays, so a
 * signal handler reading its gauges never sees freed memory. */
void ipcc_cache_clear(struct ipcc_cache *c)
{
    recall_all(c);
    struct ipcc_entry *e, *tmp;
    HASH_ITER(hh_key, c->by_key, e, tmp) {
        unlink_entry(c, e);
        ipcc_mem_free(e);
    }
}

void ipcc_cache_destroy(struct ipcc_cache *c)
{
    if (!c)
        return;
    ipcc_cache_clear(c);
    free(c); /* aligned_alloc's, made and dropped outside the lock */
}

/* Builds a key with every byte defined (the hash covers padding too) and
 * hashes it here, so the caller can do it before taking the lock. */
void ipcc_key_init(struct ipcc_key *k, uint64_t ctx_id, const void *handle,
                   uint32_t flags)
{
    k->ctx_id = ctx_id;
    k->flags = flags;
    k->zero_pad = 0;
    memcpy(k->handle, handle, IPCC_HANDLE_BYTES);
    k->zero_pad2 = 0;
    k->hash = hash_words(k, KEY_BYTES);
}

/* The entry a key names, directly or as an alias; NULL if none. */
static struct ipcc_entry *find_key(struct ipcc_cache *c, const struct ipcc_key *k)
{
    struct ipcc_entry *e;
    HASH_FIND_BYHASHVALUE(hh_key, c->by_key, k, KEY_BYTES, k->hash, e);
    if (!e && c->by_alias) {
        struct ipcc_alias *a;
        HASH_FIND_BYHASHVALUE(hh, c->by_alias, k, KEY_BYTES, k->hash, a);
        e = a ? a->entry : NULL;
    }
    note_use(e);
    return e;
}

/* A reference taken under the lock; on a lent entry, outside its slots. */
static void take_ref(struct ipcc_cache *c, struct ipcc_entry *e)
{
    if (e->lent_to) {
        e->refs++;
        mirror_outside_refs(e);
    } else if (e->refs++ == 0) {
        DL_DELETE(c->lru, e);
        gauge_sub(&c->gauges.idle, 1);
        gauge_sub(&c->gauges.idle_bytes, e->bytes);
        gauge_add(&c->gauges.live, 1);
    }
}

/* On a hit takes one reference, stores the mapping's pointer in *dptr and
 * returns 1; returns 0 on a miss and leaves *dptr alone. */
static void hit(struct ipcc_cache *c, struct ipcc_entry *e, uint64_t *dptr)
{
    take_ref(c, e);
    top_update(c, e, 1);
    *dptr = e->pkey.dptr;
}

int ipcc_cache_acquire(struct ipcc_cache *c, const struct ipcc_key *k, uint64_t *dptr)
{
    struct ipcc_entry *e = find_key(c, k);
    if (!e)
        return 0;
    hit(c, e, dptr);
    remember_recent(c, e, k);
    return 1;
}

/* Whether (ctx_id, handle, flags) is what this thread last hit or inserted:
 * a thread-local comparison, made before taking the lock. */
int ipcc_cache_recent_is(uint64_t ctx_id, const void *handle, uint32_t flags)
{
    return recent.e && recent.ctx_id == ctx_id && recent.flags == flags &&
           memcmp(recent.handle, handle, IPCC_HANDLE_BYTES) == 0;
}

/* ipcc_cache_acquire of the key ipcc_cache_recent_is matched, without
 * looking it up: 0 when that entry has left the table meanwhile (the
 * caller then looks the key up). */
int ipcc_cache_acquire_recent(struct ipcc_cache *c, uint64_t *dptr)
{
    struct ipcc_entry *e = recent_entry(c);
    if (!e)
        return 0;
    note_use(e);
    hit(c, e, dptr);
    return 1;
}

/* Records k as another key of e, with one reference: 0, or -1 when out of
 * memory (nothing recorded). */
static int add_alias(struct ipcc_cache *c, struct ipcc_entry *e, const struct ipcc_key *k)
{
    struct ipcc_alias *a = ipcc_mem_calloc(1, sizeof(*a));
    if (!a)
        return -1;
    a->key = *k;
    a->entry = e;
    ipcc_cache_oom = 0;
    HASH_ADD_BYHASHVALUE(hh, c->by_alias, key, KEY_BYTES, k->hash, a);
    if (ipcc_cache_oom) {
        ipcc_mem_free(a);
        return -1;
    }
    a->next = e->aliases;
    e->aliases = a;
    take_ref(c, e);
    top_update(c, e, 0);
    remember_recent(c, e, k);
    return 0;
}

/*
 * Records a mapping the caller has just opened, with one reference.
 * Returns 1 when inserted. Returns 0 when the mapping is already cached -
 * under this key (another thread's miss won the race) or under another key
 * whose handle the driver resolved to the same mapping (k becomes its
 * alias): a reference is taken on that entry instead, its pointer goes to
 * *cached_dptr, and the caller must drop the driver reference it holds
 * itself, since an entry holds exactly one. Returns -1 when out of memory
 * (nothing cached).
 */
int ipcc_cache_insert(struct ipcc_cache *c, const struct ipcc_key *k, void *ctx,
                      uint64_t dptr, uint64_t bytes, uint64_t now_ns,
                      uint64_t *cached_dptr)
{
    if (ipcc_cache_acquire(c, k, cached_dptr))
        return 0;
    struct ptr_key pk = { .ctx_id = k->ctx_id, .dptr = dptr };
    struct ipcc_entry *e;
    HASH_FIND(hh_ptr, c->by_ptr, &pk, sizeof(pk), e);
    if (e) {
        note_use(e);
        *cached_dptr = dptr;
        return add_alias(c, e, k);
    }

    e = ipcc_mem_calloc(1, sizeof(*e));
    if (!e)
        return -1;
    e->key = *k;
    e->pkey = pk;
    e->ctx = ctx;
    e->bytes = bytes;
    e->refs = 1;
    e->last_user = &lent;
    e->runs = 1;

    ipcc_cache_oom = 0;
    HASH_ADD_BYHASHVALUE(hh_key, c->by_key, key, KEY_BYTES, k->hash, e);
    if (ipcc_cache_oom) {
        ipcc_mem_free(e);
        return -1;
    }
    HASH_ADD(hh_ptr, c->by_ptr, pkey, sizeof(e->pkey), e);
    if (ipcc_cache_oom) {
        HASH_DELETE(hh_key, c->by_key, e);
        ipcc_mem_free(e);
        return -1;
    }
    gauge_add(&c->gauges.live, 1);
    top_attach(c, e, now_ns);
    remember_recent(c, e, k);
    return 1;
}

/* The entry of the mapping at dptr in context ctx_id; NULL if none. */
static struct ipcc_entry *find_ptr(struct ipcc_cache *c, uint64_t ctx_id, uint64_t dptr)
{
    struct ipcc_entry *e = recent_entry(c);
    if (!(e && e->pkey.dptr == dptr && e->pkey.ctx_id == ctx_id)) {
        struct ptr_key pk = { .ctx_id = ctx_id, .dptr = dptr };
        HASH_FIND(hh_ptr, c->by_ptr, &pk, sizeof(pk), e);
    }
    note_use(e);
    return e;
}

/* Lock held: a close of a lent entry while it holds references outside
 * its slots takes one of those: the total stays exact, no loan comes back.
 * The entry is idle if its slots hold none either: this close may be the
 * last one of it. */
static void close_outside_slots(struct ipcc_entry *e, uint64_t now_ns)
{
    if (--e->refs == 0)
        e->idle_ns = max_u64(e->idle_ns, now_ns);
    mirror_outside_refs(e);
}

/* Drops one reference of the mapping at dptr in context ctx_id. At zero the
 * entry stays cached, idle, at the most-recent end of the LRU list. A close
 * of an idle entry (past zero) removes it: the application closes a
 * reference it took outside the cache (or none), so the caller gives the
 * cache's own reference back and lets the driver answer the close. */
enum ipcc_release_result ipcc_cache_release(struct ipcc_cache *c, uint64_t ctx_id,
                                            uint64_t dptr, uint64_t now_ns)
{
    ipcc_cache_lent_floor(now_ns);
    struct ipcc_entry *e = find_ptr(c, ctx_id, dptr);
    if (!e)
        return IPCC_RELEASE_NOT_FOUND;
    if (e->lent_to && e->refs > 0) {
        close_outside_slots(e, now_ns);
        top_update(c, e, 0);
        return IPCC_RELEASE_OK;
    }
    take_back_for_close(c, e);
    if (e->refs == 0) {
        unlink_entry(c, e);
        ipcc_mem_free(e);
        return IPCC_RELEASE_PAST_ZERO;
    }
    if (--e->refs == 0) {
        e->idle_ns = now_ns;
        DL_APPEND(c->lru, e);
        gauge_sub(&c->gauges.live, 1);
        gauge_add(&c->gauges.idle, 1);
        gauge_add(&c->gauges.idle_bytes, e->bytes);
    }
    top_update(c, e, 0);
    return IPCC_RELEASE_OK;
}

/* Whether idle mappings exceed either cap. Reads only the gauges, so it is
 * also a cheap check without the lock. */
int ipcc_cache_over_caps(const struct ipcc_cache *c, uint64_t max_bytes, uint64_t max_entries)
{
    return atomic_load_explicit(&c->gauges.idle_bytes, memory_order_relaxed) > max_bytes ||
           atomic_load_explicit(&c->gauges.idle, memory_order_relaxed) > max_entries;
}

/* When the least recently used idle entry went idle: 1 and *ns set, or 0
 * when nothing is idle. The budget shared with the VMM path compares it
 * with that path's oldest idle thing (tables.c). */
int ipcc_cache_oldest_idle(const struct ipcc_cache *c, uint64_t *ns)
{
    if (!c->lru)
        return 0;
    *ns = c->lru->idle_ns;
    return 1;
}

/* Removes least recently used idle entries until both caps hold (or cap
 * victims are collected) and describes them in out[]; the caller closes them.
 * Returns how many were removed. UINT64_MAX caps evict everything idle. */
size_t ipcc_cache_evict(struct ipcc_cache *c, uint64_t max_idle_bytes,
                        uint64_t max_idle_entries, struct ipcc_victim *out, size_t cap)
{
    size_t n = 0;
    recall_all(c);
    while (n < cap && c->lru && ipcc_cache_over_caps(c, max_idle_bytes, max_idle_entries))
        remove_entry(c, c->lru, out, cap, &n);
    return n;
}

/* Removes idle entries of every context but keep_ctx_id (at most cap) and
 * describes them in out[]; the caller closes them. */
size_t ipcc_cache_evict_other_contexts(struct ipcc_cache *c, uint64_t keep_ctx_id,
                                       struct ipcc_victim *out, size_t cap)
{
    struct ipcc_entry *e, *tmp;
    size_t n = 0;
    recall_all(c);
    DL_FOREACH_SAFE(c->lru, e, tmp) {
        if (n == cap)
            break;
        if (e->key.ctx_id != keep_ctx_id)
            remove_entry(c, e, out, cap, &n);
    }
    return n;
}

/* Forgets every entry of a context that no longer exists (its mappings died
 * with it). Returns how many; the first cap are described in out[]. */
size_t ipcc_cache_drop_ctx(struct ipcc_cache *c, uint64_t ctx_id,
                           struct ipcc_victim *out, size_t cap)
{
    struct ipcc_entry *e, *tmp;
    size_t n = 0;
    recall_all(c);
    HASH_ITER(hh_key, c->by_key, e, tmp) {
        if (e->key.ctx_id == ctx_id)
            remove_entry(c, e, out, cap, &n);
    }
    return n;
}

/* Lists the distinct contexts that own entries (at most cap). */
size_t ipcc_cache_contexts(struct ipcc_cache *c, void **ctxs, uint64_t *ids, size_t cap)
{
    struct ipcc_entry *e, *tmp;
    size_t n = 0;
    HASH_ITER(hh_key, c->by_key, e, tmp) {
        size_t i = 0;
        while (i < n && ids[i] != e->key.ctx_id)
            i++;
        if (i < n || n == cap)
            continue;
        ctxs[n] = e->ctx;
        ids[n] = e->key.ctx_id;
        n++;
    }
    return n;
}

size_t ipcc_cache_count(const struct ipcc_cache *c)
{
    return HASH_CNT(hh_key, c->by_key);
}

const struct ipcc_cache_gauges *ipcc_cache_gauges(const struct ipcc_cache *c)
{
    return &c->gauges;
}

const struct ipcc_top_slot *ipcc_cache_top(const struct ipcc_cache *c)
{
    return c->top;
}

/* Removes idle entries of the allocation behind handle, in any context (at
 * most cap), describing them in out[]; the caller closes them. Adds to
 * *live_bytes the bytes of its entries still referenced (left in place).
 * Used when the exporter frees that allocation. */
size_t ipcc_cache_take_idle_by_handle(struct ipcc_cache *c, const void *handle,
                                      struct ipcc_victim *out, size_t cap,
                                      uint64_t *live_bytes)
{
    struct ipcc_entry *e, *tmp;
    size_t n = 0;
    recall_all(c);
    HASH_ITER(hh_key, c->by_key, e, tmp) {
        if (memcmp(e->key.handle, handle, IPCC_HANDLE_BYTES) != 0)
            continue;
        if (e->refs > 0)
            *live_bytes += e->bytes;
        else if (n < cap)
            remove_entry(c, e, out, cap, &n);
    }
    return n;
}

/* ---- lending: see "entries lent to threads" above ------------------------ */

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
int ipcc_cache_recent_lendable(struct ipcc_cache *c)
{
    struct ipcc_entry *e = recent_entry(c);
    return e && lendable(e);
}

/* Lock held: slot s of this thread holds e from now on, with one reference
 * of e's (the one this thread just took). */
static void lend_to_slot(struct ipcc_cache *c, struct ipcc_entry *e, struct lent_slot *s,
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
int ipcc_cache_lend_recent(struct ipcc_cache *c, uint64_t now_ns, uint64_t room_entries,
                           uint64_t room_bytes)
{
    struct ipcc_entry *e = recent_entry(c);
    if (!e || !lendable(e))
        return 0;
    if (!e->lent_to && (room_entries < 1 || room_bytes < e->bytes))
        return 0;
    struct lent_slot *s = my_slot();
    if (!s)
        return 0;
    const struct ipcc_cache *had = atomic_load_explicit(&s->cache, memory_order_relaxed);
    if (had == c)
        recall(c, s);
    else if (had && (atomic_load(&s->state) & LENT))
        return 0; /* lent from another table (unit tests only): keep it */
    lend_to_slot(c, e, s, now_ns);
    lent.ctx_id = e->key.ctx_id;
    lent.flags = recent.flags;
    memcpy(lent.handle, recent.handle, IPCC_HANDLE_BYTES);
    lent.dptr = e->pkey.dptr;
    ipcc_cache_lent_floor(now_ns);
    atomic_store_explicit(&s->state, LENT | 1, memory_order_release);
    return 1;
}

/* No lock: an open of what this thread was lent takes one of its own
 * references and counts its hit, both in its slot's state. 1 and *dptr
 * set, or 0: the locked path must answer. */
int ipcc_cache_open_lent(uint64_t ctx_id, const void *handle, uint32_t flags, uint64_t *dptr)
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
int ipcc_cache_close_lent(uint64_t ctx_id, uint64_t dptr, uint64_t now_ns)
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
void ipcc_cache_return_lent(struct ipcc_cache *c, int give_up)
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
void ipcc_cache_lent_floor(uint64_t now_ns)
{
    lent.floor_ns = max_u64(lent.floor_ns, now_ns);
}

/* Whether this thread has an entry lent (one load). */
int ipcc_cache_has_lent(void)
{
    return lent.slot && (atomic_load_explicit(&lent.slot->state, memory_order_relaxed) & LENT);
}

/* What is lent now, all tables together: counted as idle by every budget
 * check. Async-signal-safe. */
void ipcc_cache_lent_totals(uint64_t *entries, uint64_t *bytes)
{
    *entries = atomic_load_explicit(&lent_count, memory_order_relaxed);
    *bytes = atomic_load_explicit(&lent_bytes, memory_order_relaxed);
}

/* Whether slot i is lent an entry of c: its state then, or 0. */
static uint64_t lent_state(const struct ipcc_cache *c, int i)
{
    const struct lent_slot *s = &lent_slots[i];
    uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    return (st & LENT) && atomic_load_explicit(&s->cache, memory_order_relaxed) == c ? st : 0;
}

/* The references of the entry lent to slot i, if i is the first slot that
 * holds it (so that a shared entry counts once): 1 and *refs set, else 0.
 * Compares entry addresses, never follows one. Async-signal-safe. */
static int lent_entry_refs(const struct ipcc_cache *c, int i, uint64_t st, uint64_t *refs)
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
void ipcc_cache_gauges_now(const struct ipcc_cache *c, struct ipcc_cache_totals *out)
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
void ipcc_cache_top_now(const struct ipcc_cache *c, struct ipcc_top_slot *out)
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
void ipcc_cache_recall_all(struct ipcc_cache *c)
{
    recall_all(c);
}

/* Fork child: the other threads and their loans are gone; this thread
 * forgets its slot. The table is cleared after. */
void ipcc_cache_lent_fork_child(struct ipcc_cache *c)
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
