/*
 * legacy_table.c - the table of cached IPC mappings.
 *
 * Pure data structure: no CUDA, no I/O, no locking (the caller holds the one
 * lock, except for the calls on an entry lent to the calling thread, which
 * need none: legacy_loans.c). Two indexes over the same entries, both uthash:
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* uthash must not abort the process on allocation failure: it leaves the
 * element out and raises this flag instead (read under the caller's lock). */
static int ipcc_legacy_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(elt) (ipcc_legacy_oom = 1)

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

#include "legacy_loans_impl.h"
#include <utlist.h>

/* The identity part of a key: everything before its cached hash. */
#define KEY_BYTES offsetof(struct ipcc_legacy_key, hash)

_Static_assert(KEY_BYTES % 8 == 0, "hash_words reads whole words");
_Static_assert(sizeof(struct ptr_key) % 8 == 0, "hash_words reads whole words");

/* ---- the calling thread's last hit -------------------------------------- */

/*
 * A thread that opens and closes one handle again and again finds its entry
 * here, without hashing the key or searching either index. The memo is the
 * thread's own; it is used only under the caller's lock, and only while no
 * entry has left a table since it was taken (removed_gen): an entry freed
 * since may lie at the same address. Defined in legacy_loans.c, which lends
 * the memo's entry: the table calls down to its loans, never the reverse.
 */
static void remember_recent(const struct ipcc_legacy_table *c, struct ipcc_entry *e,
                            const struct ipcc_legacy_key *k)
{
    recent.c = c;
    recent.e = e;
    recent.gen = removed_gen;
    recent.ctx_id = k->ctx_id;
    recent.flags = k->flags;
    memcpy(recent.handle, k->handle, IPCC_HANDLE_BYTES);
}

/* Mirror an entry into a free top slot, if any is left. */
static void top_attach(struct ipcc_legacy_table *c, struct ipcc_entry *e, uint64_t now_ns)
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

static void top_detach(struct ipcc_legacy_table *c, struct ipcc_entry *e)
{
    if (e->top_slot >= 0)
        atomic_store_explicit(&c->top[e->top_slot].used, 0, memory_order_release);
    e->top_slot = -1;
}

/* Take an entry off every index and the gauges, freeing its aliases; the
 * caller frees the entry. */
static void unlink_entry(struct ipcc_legacy_table *c, struct ipcc_entry *e)
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
    if (e->doomed)
        gauge_sub(&c->gauges.doomed_bytes, e->bytes);
    top_detach(c, e);
}

/* Removes and frees an entry, describing it in out[*n] while there is room;
 * counts it in *n either way. */
static void remove_entry(struct ipcc_legacy_table *c, struct ipcc_entry *e,
                         struct ipcc_legacy_victim *out, size_t cap, size_t *n)
{
    if (out && *n < cap) {
        struct ipcc_legacy_victim *v = &out[*n];
        v->ctx = e->ctx;
        v->ctx_id = e->key.ctx_id;
        v->dptr = e->pkey.dptr;
        v->bytes = e->bytes;
        memcpy(v->handle, e->key.handle, IPCC_HANDLE_BYTES);
    }
    (*n)++;
    unlink_entry(c, e);
    ipcc_mem_free(e);
}

/* ---- API ---------------------------------------------------------------- */

/* Returns an empty table, or NULL when out of memory. */
struct ipcc_legacy_table *ipcc_legacy_table_create(void)
{
    /* Aligned as its mirror slots are, a line each. */
    struct ipcc_legacy_table *c =
        aligned_alloc(_Alignof(struct ipcc_legacy_table), sizeof(struct ipcc_legacy_table));
    if (c)
        memset(c, 0, sizeof(*c));
    return c;
}

/* Forgets every entry without closing anything: for the fork child, whose
 * mappings belong to its parent's contexts. The table itself stays, so a
 * signal handler reading its gauges never sees freed memory. */
void ipcc_legacy_table_clear(struct ipcc_legacy_table *c)
{
    recall_all(c);
    struct ipcc_entry *e, *tmp;
    HASH_ITER(hh_key, c->by_key, e, tmp) {
        unlink_entry(c, e);
        ipcc_mem_free(e);
    }
}

void ipcc_legacy_table_destroy(struct ipcc_legacy_table *c)
{
    if (!c)
        return;
    ipcc_legacy_table_clear(c);
    free(c); /* aligned_alloc's, made and dropped outside the lock */
}

/* Builds a key with every byte defined (the hash covers padding too) and
 * hashes it here, so the caller can do it before taking the lock. */
void ipcc_legacy_key_init(struct ipcc_legacy_key *k, uint64_t ctx_id, const void *handle,
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
static struct ipcc_entry *find_key(struct ipcc_legacy_table *c, const struct ipcc_legacy_key *k)
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
static void take_ref(struct ipcc_legacy_table *c, struct ipcc_entry *e)
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
static void hit(struct ipcc_legacy_table *c, struct ipcc_entry *e, uint64_t *dptr)
{
    take_ref(c, e);
    top_update(c, e, 1);
    *dptr = e->pkey.dptr;
}

int ipcc_legacy_find(struct ipcc_legacy_table *c, const struct ipcc_legacy_key *k, uint64_t *dptr)
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
int ipcc_legacy_recent_is(uint64_t ctx_id, const void *handle, uint32_t flags)
{
    return recent.e && recent.ctx_id == ctx_id && recent.flags == flags &&
           memcmp(recent.handle, handle, IPCC_HANDLE_BYTES) == 0;
}

/* ipcc_legacy_find of the key ipcc_legacy_recent_is matched, without
 * looking it up: 0 when that entry has left the table meanwhile (the
 * caller then looks the key up). */
int ipcc_legacy_find_recent(struct ipcc_legacy_table *c, uint64_t *dptr)
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
static int add_alias(struct ipcc_legacy_table *c, struct ipcc_entry *e,
                     const struct ipcc_legacy_key *k)
{
    struct ipcc_alias *a = ipcc_mem_calloc(1, sizeof(*a));
    if (!a)
        return -1;
    a->key = *k;
    a->entry = e;
    ipcc_legacy_oom = 0;
    HASH_ADD_BYHASHVALUE(hh, c->by_alias, key, KEY_BYTES, k->hash, a);
    if (ipcc_legacy_oom) {
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
int ipcc_legacy_insert(struct ipcc_legacy_table *c, const struct ipcc_legacy_key *k, void *ctx,
                       uint64_t dptr, uint64_t bytes, uint64_t now_ns,
                       uint64_t *cached_dptr)
{
    if (ipcc_legacy_find(c, k, cached_dptr))
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

    ipcc_legacy_oom = 0;
    HASH_ADD_BYHASHVALUE(hh_key, c->by_key, key, KEY_BYTES, k->hash, e);
    if (ipcc_legacy_oom) {
        ipcc_mem_free(e);
        return -1;
    }
    HASH_ADD(hh_ptr, c->by_ptr, pkey, sizeof(e->pkey), e);
    if (ipcc_legacy_oom) {
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
static struct ipcc_entry *find_ptr(struct ipcc_legacy_table *c, uint64_t ctx_id, uint64_t dptr)
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
 * entry stays cached, idle, at the most-recent end of the LRU list, unless
 * its exporter freed it (doomed): then it is removed and the caller gives
 * the cache's reference back (IPCC_RELEASE_LAST). A close of an idle entry
 * (past zero) removes it: the application closes a reference it took
 * outside the cache (or none), so the caller gives the cache's own
 * reference back and lets the driver answer the close. */
enum ipcc_release_result ipcc_legacy_release(struct ipcc_legacy_table *c, uint64_t ctx_id,
                                             uint64_t dptr, uint64_t now_ns)
{
    lent_floor(now_ns);
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
    if (e->refs == 1 && e->doomed) {
        unlink_entry(c, e);
        ipcc_mem_free(e);
        return IPCC_RELEASE_LAST;
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
static int over_caps(const struct ipcc_legacy_table *c, uint64_t max_bytes, uint64_t max_entries)
{
    return atomic_load_explicit(&c->gauges.idle_bytes, memory_order_relaxed) > max_bytes ||
           atomic_load_explicit(&c->gauges.idle, memory_order_relaxed) > max_entries;
}

/* When the least recently used idle entry went idle: 1 and *ns set, or 0
 * when nothing is idle. The budget shared with the VMM path compares it
 * with that path's oldest idle thing (budget_tables.c). */
int ipcc_legacy_oldest_idle(const struct ipcc_legacy_table *c, uint64_t *ns)
{
    if (!c->lru)
        return 0;
    *ns = c->lru->idle_ns;
    return 1;
}

/* Removes least recently used idle entries until both caps hold (or cap
 * victims are collected) and describes them in out[]; the caller closes them.
 * Returns how many were removed. UINT64_MAX caps evict everything idle. */
size_t ipcc_legacy_evict(struct ipcc_legacy_table *c, uint64_t max_idle_bytes,
                         uint64_t max_idle_entries, struct ipcc_legacy_victim *out, size_t cap)
{
    size_t n = 0;
    recall_all(c);
    while (n < cap && c->lru && over_caps(c, max_idle_bytes, max_idle_entries))
        remove_entry(c, c->lru, out, cap, &n);
    return n;
}

/* Whether test accepts the handle of one of the entry's keys. */
static int any_key(const struct ipcc_entry *e, ipcc_legacy_handle_test test, void *arg)
{
    if (test(e->key.handle, arg))
        return 1;
    for (const struct ipcc_alias *a = e->aliases; a; a = a->next)
        if (test(a->key.handle, arg))
            return 1;
    return 0;
}

/* Removes idle entries of every context but keep_ctx_id that in_the_way
 * accepts (at most cap) and describes them in out[]; the caller closes them. */
size_t ipcc_legacy_evict_other_contexts(struct ipcc_legacy_table *c, uint64_t keep_ctx_id,
                                        ipcc_legacy_handle_test in_the_way, void *arg,
                                        struct ipcc_legacy_victim *out, size_t cap)
{
    struct ipcc_entry *e, *tmp;
    size_t n = 0;
    recall_all(c);
    DL_FOREACH_SAFE(c->lru, e, tmp) {
        if (n == cap)
            break;
        if (e->key.ctx_id != keep_ctx_id && any_key(e, in_the_way, arg))
            remove_entry(c, e, out, cap, &n);
    }
    return n;
}

/* Forgets every entry of a context that no longer exists (its mappings died
 * with it). Returns how many; the first cap are described in out[]. */
size_t ipcc_legacy_drop_context(struct ipcc_legacy_table *c, uint64_t ctx_id,
                                struct ipcc_legacy_victim *out, size_t cap)
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
size_t ipcc_legacy_contexts(struct ipcc_legacy_table *c, void **ctxs, uint64_t *ids, size_t cap)
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

size_t ipcc_legacy_table_entries(const struct ipcc_legacy_table *c)
{
    return HASH_CNT(hh_key, c->by_key);
}

const struct ipcc_legacy_gauges *ipcc_legacy_table_gauges(const struct ipcc_legacy_table *c)
{
    return &c->gauges;
}

const struct ipcc_top_slot *ipcc_legacy_table_top(const struct ipcc_legacy_table *c)
{
    return c->top;
}

static int same_handle(const void *handle, void *wanted)
{
    return memcmp(handle, wanted, IPCC_HANDLE_BYTES) == 0;
}

/* Removes idle entries of the allocation behind handle, in any context (at
 * most cap), describing them in out[]; the caller closes them. Its entries
 * still referenced stay, doomed (counted once in doomed_bytes): their last
 * close removes them. A flag per entry, so that however many an exporter
 * frees while the program uses them, none stays mapped after its close.
 * Used when the exporter frees that allocation: an entry opened first
 * through another handle of it holds this one as an alias. */
size_t ipcc_legacy_take_idle_by_handle(struct ipcc_legacy_table *c, const void *handle,
                                       struct ipcc_legacy_victim *out, size_t cap)
{
    struct ipcc_entry *e, *tmp;
    size_t n = 0;
    recall_all(c);
    HASH_ITER(hh_key, c->by_key, e, tmp) {
        if (!any_key(e, same_handle, (void *)handle))
            continue;
        if (e->refs > 0) {
            if (!e->doomed)
                gauge_add(&c->gauges.doomed_bytes, e->bytes);
            e->doomed = 1;
        } else if (n < cap)
            remove_entry(c, e, out, cap, &n);
    }
    return n;
}
