/*
 * test_legacy_table.c - the table alone: no CUDA, no preload. References, the LRU
 * order, the caps, and per-context removal.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "legacy_table.h"

static struct ipcc_legacy_table *cache;

/* The link wraps the tables' calloc (the Makefile's --wrap; the names are
 * the linker's): while this is set, every allocation of the table fails. */
static int fail_calloc;
void *__real_ipcc_mem_calloc(size_t n, size_t size);
void *__wrap_ipcc_mem_calloc(size_t n, size_t size);
void *__wrap_ipcc_mem_calloc(size_t n, size_t size)
{
    return fail_calloc ? NULL : __real_ipcc_mem_calloc(n, size);
}
static unsigned char handle_bytes[IPCC_HANDLE_BYTES];

static void setup(void)
{
    cache = ipcc_legacy_table_create();
    cr_assert_not_null(cache);
}

static void teardown(void)
{
    ipcc_legacy_table_destroy(cache);
}

static struct ipcc_legacy_key key(uint64_t ctx, unsigned char tag)
{
    struct ipcc_legacy_key k;
    memset(handle_bytes, 0, sizeof(handle_bytes));
    handle_bytes[0] = tag;
    ipcc_legacy_key_init(&k, ctx, handle_bytes, 1);
    return k;
}

static void insert(uint64_t ctx, unsigned char tag, uint64_t dptr, uint64_t bytes)
{
    struct ipcc_legacy_key k = key(ctx, tag);
    uint64_t unused;
    cr_assert_eq(ipcc_legacy_insert(cache, &k, (void *)(uintptr_t)ctx, dptr, bytes, 0, &unused), 1);
}

static uint64_t gauge(const _Atomic uint64_t *g)
{
    return atomic_load(g);
}

TestSuite(legacy_table, .init = setup, .fini = teardown, .timeout = 10);

/* A key not inserted is a miss and leaves the output alone. */
Test(legacy_table, empty_table_misses)
{
    struct ipcc_legacy_key k = key(1, 1);
    uint64_t p = 77;
    cr_assert_eq(ipcc_legacy_find(cache, &k, &p), 0);
    cr_assert_eq(p, 77);
}

/* Insert then acquire returns the pointer and counts two references. */
Test(legacy_table, insert_then_acquire)
{
    insert(1, 1, 0x1000, 4096);
    struct ipcc_legacy_key k = key(1, 1);
    uint64_t p = 0;
    cr_assert_eq(ipcc_legacy_find(cache, &k, &p), 1);
    cr_assert_eq(p, 0x1000);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_PAST_ZERO);
}

/* Flags and context are part of the key. */
Test(legacy_table, key_includes_flags_and_context)
{
    insert(1, 1, 0x1000, 4096);
    struct ipcc_legacy_key other_ctx = key(2, 1), other_flags = key(1, 1);
    other_flags.flags = 0;
    uint64_t p;
    cr_assert_eq(ipcc_legacy_find(cache, &other_ctx, &p), 0);
    cr_assert_eq(ipcc_legacy_find(cache, &other_flags, &p), 0);
}

/* A second insert of the same key shares the first entry (lost race). */
Test(legacy_table, duplicate_insert_shares_entry)
{
    insert(1, 1, 0x1000, 4096);
    struct ipcc_legacy_key k = key(1, 1);
    uint64_t cached = 0;
    cr_assert_eq(ipcc_legacy_insert(cache, &k, NULL, 0x1000, 4096, 0, &cached), 0);
    cr_assert_eq(cached, 0x1000);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 1);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->live), 1);
}

/* Releasing an unknown pointer, or one of another context, is not found. */
Test(legacy_table, release_unknown)
{
    insert(1, 1, 0x1000, 4096);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x2000, 0), IPCC_RELEASE_NOT_FOUND);
    cr_assert_eq(ipcc_legacy_release(cache, 2, 0x1000, 0), IPCC_RELEASE_NOT_FOUND);
}

/* The gauges follow entries between live and idle. */
Test(legacy_table, gauges_track_idle_bytes)
{
    const struct ipcc_legacy_gauges *g = ipcc_legacy_table_gauges(cache);
    insert(1, 1, 0x1000, 100);
    insert(1, 2, 0x2000, 200);
    cr_assert_eq(gauge(&g->live), 2);
    ipcc_legacy_release(cache, 1, 0x2000, 0);
    cr_assert_eq(gauge(&g->live), 1);
    cr_assert_eq(gauge(&g->idle), 1);
    cr_assert_eq(gauge(&g->idle_bytes), 200);
    struct ipcc_legacy_key k = key(1, 2);
    uint64_t p;
    ipcc_legacy_find(cache, &k, &p);
    cr_assert_eq(gauge(&g->idle), 0);
    cr_assert_eq(gauge(&g->idle_bytes), 0);
}

/* Eviction takes idle entries oldest first, only as many as the caps need. */
Test(legacy_table, evict_lru_order)
{
    for (unsigned char i = 1; i <= 4; i++) {
        insert(1, i, 0x1000 * i, 100);
        ipcc_legacy_release(cache, 1, 0x1000 * i, 0);
    }
    struct ipcc_legacy_victim v[8];
    cr_assert_eq(ipcc_legacy_evict(cache, UINT64_MAX, 2, v, 8), 2);
    cr_assert_eq(v[0].dptr, 0x1000);
    cr_assert_eq(v[1].dptr, 0x2000);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 2);
    cr_assert_eq(ipcc_legacy_evict(cache, 150, UINT64_MAX, v, 8), 1);
    cr_assert_eq(v[0].dptr, 0x3000);
}

/* Eviction never touches live entries and respects the output capacity. */
Test(legacy_table, evict_skips_live_and_honours_capacity)
{
    insert(1, 1, 0x1000, 100);
    for (unsigned char i = 2; i <= 5; i++) {
        insert(1, i, 0x1000 * i, 100);
        ipcc_legacy_release(cache, 1, 0x1000 * i, 0);
    }
    struct ipcc_legacy_victim v[2];
    cr_assert_eq(ipcc_legacy_evict(cache, 0, 0, v, 2), 2);
    cr_assert_eq(ipcc_legacy_evict(cache, 0, 0, v, 2), 2);
    cr_assert_eq(ipcc_legacy_evict(cache, 0, 0, v, 2), 0);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 1);
}

/* Dropping a context removes its entries, live or idle, and no others. */
Test(legacy_table, drop_context)
{
    insert(1, 1, 0x1000, 100);
    insert(2, 1, 0x1000, 100);
    insert(1, 2, 0x2000, 100);
    ipcc_legacy_release(cache, 1, 0x2000, 0);
    cr_assert_eq(ipcc_legacy_drop_context(cache, 1, NULL, 0), 2);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 1);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->idle_bytes), 0);
    void *ctxs[4];
    uint64_t ids[4];
    cr_assert_eq(ipcc_legacy_contexts(cache, ctxs, ids, 4), 1);
    cr_assert_eq(ids[0], 2);
}

/* The top slots mirror entries for the signal handler, and free on removal. */
Test(legacy_table, top_slots_mirror_entries)
{
    insert(7, 1, 0x1000, 4096);
    struct ipcc_legacy_key k = key(7, 1);
    uint64_t p;
    ipcc_legacy_find(cache, &k, &p);
    const struct ipcc_top_slot *s = ipcc_legacy_table_top(cache);
    cr_assert_eq(atomic_load(&s[0].used), 1);
    cr_assert_eq(atomic_load(&s[0].ctx_id), 7);
    cr_assert_eq(atomic_load(&s[0].hits), 1);
    cr_assert_eq(atomic_load(&s[0].refs), 2);
    ipcc_legacy_drop_context(cache, 7, NULL, 0);
    cr_assert_eq(atomic_load(&s[0].used), 0);
}

/* Clearing (the fork child) empties the table but keeps it usable. */
Test(legacy_table, clear_keeps_table_usable)
{
    insert(1, 1, 0x1000, 100);
    ipcc_legacy_table_clear(cache);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 0);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->live), 0);
    insert(1, 1, 0x1000, 100);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 1);
}

/* A second key for a cached pointer becomes an alias: one entry, one more
 * reference, and the caller told to give its own driver reference back. */
Test(legacy_table, same_pointer_under_a_second_key_is_an_alias)
{
    insert(1, 1, 0x1000, 100);
    struct ipcc_legacy_key k2 = key(1, 2);
    uint64_t cached = 0, p = 0;
    cr_assert_eq(ipcc_legacy_insert(cache, &k2, NULL, 0x1000, 100, 0, &cached), 0);
    cr_assert_eq(cached, 0x1000);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 1);
    cr_assert_eq(ipcc_legacy_find(cache, &k2, &p), 1);
    cr_assert_eq(p, 0x1000);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_OK);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->idle), 1);
}

/* A close past zero removes the entry (with its aliases): the next open of
 * either key is a miss. */
Test(legacy_table, past_zero_removes_the_entry)
{
    insert(1, 1, 0x1000, 100);
    struct ipcc_legacy_key k1 = key(1, 1), k2 = key(1, 2);
    uint64_t cached, p;
    cr_assert_eq(ipcc_legacy_insert(cache, &k2, NULL, 0x1000, 100, 0, &cached), 0);
    ipcc_legacy_release(cache, 1, 0x1000, 0);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_PAST_ZERO);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 0);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->idle), 0);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->idle_bytes), 0);
    cr_assert_eq(ipcc_legacy_find(cache, &k1, &p), 0);
    cr_assert_eq(ipcc_legacy_find(cache, &k2, &p), 0);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_NOT_FOUND);
}

/* Evicting an entry takes its aliases too: a later insert under the alias
 * key is a fresh entry. */
Test(legacy_table, eviction_takes_the_aliases)
{
    insert(1, 1, 0x1000, 100);
    struct ipcc_legacy_key k2 = key(1, 2);
    uint64_t cached;
    cr_assert_eq(ipcc_legacy_insert(cache, &k2, NULL, 0x1000, 100, 0, &cached), 0);
    ipcc_legacy_release(cache, 1, 0x1000, 0);
    ipcc_legacy_release(cache, 1, 0x1000, 0);
    struct ipcc_legacy_victim v[2];
    cr_assert_eq(ipcc_legacy_evict(cache, 0, 0, v, 2), 1);
    cr_assert_eq(ipcc_legacy_insert(cache, &k2, NULL, 0x2000, 100, 0, &cached), 1);
}

/* Keys differing only in the last handle byte are different keys. */
Test(legacy_table, whole_handle_is_the_key)
{
    struct ipcc_legacy_key a, b;
    unsigned char h[IPCC_HANDLE_BYTES] = { 0 };
    ipcc_legacy_key_init(&a, 1, h, 1);
    h[IPCC_HANDLE_BYTES - 1] = 1;
    ipcc_legacy_key_init(&b, 1, h, 1);
    uint64_t unused, p;
    cr_assert_eq(ipcc_legacy_insert(cache, &a, NULL, 0x1000, 100, 0, &unused), 1);
    cr_assert_eq(ipcc_legacy_find(cache, &b, &p), 0);
}

/* Out of memory nothing is cached and the table stays as it was: a new
 * entry fails, and so does an alias, leaving the entry's references alone
 * (the caller keeps the driver's reference for the application). */
Test(legacy_table, out_of_memory_caches_nothing)
{
    insert(1, 1, 0x1000, 100);
    struct ipcc_legacy_key k2 = key(1, 2), k3 = key(1, 3);
    uint64_t cached = 0, p;
    fail_calloc = 1;
    int fresh = ipcc_legacy_insert(cache, &k3, NULL, 0x3000, 100, 0, &cached);
    int alias = ipcc_legacy_insert(cache, &k2, NULL, 0x1000, 100, 0, &cached);
    fail_calloc = 0;
    cr_assert_eq(fresh, -1);
    cr_assert_eq(alias, -1);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 1);
    cr_assert_eq(ipcc_legacy_find(cache, &k2, &p), 0);
    cr_assert_eq(ipcc_legacy_find(cache, &k3, &p), 0);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_PAST_ZERO);
}

/* Taking by handle removes that allocation's idle entries in every context,
 * leaves its referenced ones (doomed: their bytes counted in doomed_bytes)
 * and other handles alone. */
Test(legacy_table, take_idle_by_handle)
{
    insert(1, 1, 0x1000, 4096);
    insert(2, 1, 0x2000, 4096);
    insert(3, 1, 0x3000, 8192);
    insert(1, 2, 0x4000, 4096);
    ipcc_legacy_release(cache, 1, 0x1000, 0);
    ipcc_legacy_release(cache, 2, 0x2000, 0);
    ipcc_legacy_release(cache, 1, 0x4000, 0);
    struct ipcc_legacy_key k = key(1, 1); /* sets handle_bytes to tag 1 */
    (void)k;
    struct ipcc_legacy_victim v[4];
    cr_assert_eq(ipcc_legacy_take_idle_by_handle(cache, handle_bytes, v, 4), 2);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->doomed_bytes), 8192);
    cr_assert_eq(v[0].dptr + v[1].dptr, 0x3000);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 2);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->idle), 1);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->idle_bytes), 4096);
}

/* An entry still referenced when its allocation is taken is doomed: counted
 * in doomed_bytes, and its last release removes it (IPCC_RELEASE_LAST)
 * instead of leaving it idle; a second taking counts it once. */
Test(legacy_table, taken_entry_in_use_goes_at_its_last_release)
{
    insert(1, 1, 0x1000, 4096);
    uint64_t cached;
    struct ipcc_legacy_key k = key(1, 1);
    cr_assert_eq(ipcc_legacy_insert(cache, &k, NULL, 0x1000, 4096, 0, &cached), 0);
    struct ipcc_legacy_victim v[2];
    cr_assert_eq(ipcc_legacy_take_idle_by_handle(cache, handle_bytes, v, 2), 0);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->doomed_bytes), 4096);
    cr_assert_eq(ipcc_legacy_take_idle_by_handle(cache, handle_bytes, v, 2), 0);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 1);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->live), 1);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->doomed_bytes), 4096);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_legacy_release(cache, 1, 0x1000, 0), IPCC_RELEASE_LAST);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 0);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->idle), 0);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->live), 0);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->doomed_bytes), 0);
}

/* An entry opened first through another handle of the allocation (a driver
 * that gives each export a handle of its own) is taken by its alias too. */
Test(legacy_table, take_idle_by_handle_finds_an_alias)
{
    insert(1, 1, 0x1000, 4096);
    struct ipcc_legacy_key k2 = key(1, 2); /* handle_bytes: tag 2 */
    uint64_t cached;
    cr_assert_eq(ipcc_legacy_insert(cache, &k2, NULL, 0x1000, 4096, 0, &cached), 0);
    ipcc_legacy_release(cache, 1, 0x1000, 0);
    ipcc_legacy_release(cache, 1, 0x1000, 0);
    struct ipcc_legacy_victim v[2];
    cr_assert_eq(ipcc_legacy_take_idle_by_handle(cache, handle_bytes, v, 2), 1);
    cr_assert_eq(gauge(&ipcc_legacy_table_gauges(cache)->doomed_bytes), 0);
    cr_assert_eq(v[0].dptr, 0x1000);
    cr_assert_eq(ipcc_legacy_table_entries(cache), 0);
}

static int tag_is_3(const void *handle, void *arg)
{
    (void)arg;
    return ((const unsigned char *)handle)[0] == 3;
}

/* Other contexts' idle entries go only when the test accepts one of their
 * keys, aliases included; each victim names its key's handle. */
Test(legacy_table, evict_other_contexts_takes_only_what_the_test_accepts)
{
    insert(1, 1, 0x1000, 4096);
    insert(1, 2, 0x2000, 4096);
    insert(2, 3, 0x3000, 4096);
    struct ipcc_legacy_key k3 = key(1, 3);
    uint64_t cached;
    cr_assert_eq(ipcc_legacy_insert(cache, &k3, NULL, 0x2000, 4096, 0, &cached), 0);
    for (int i = 0; i < 2; i++)
        ipcc_legacy_release(cache, 1, 0x2000, 0);
    ipcc_legacy_release(cache, 1, 0x1000, 0);
    ipcc_legacy_release(cache, 2, 0x3000, 0);
    struct ipcc_legacy_victim v[4];
    cr_assert_eq(ipcc_legacy_evict_other_contexts(cache, 2, tag_is_3, NULL, v, 4), 1);
    cr_assert_eq(v[0].dptr, 0x2000);
    cr_assert_eq(v[0].handle[0], 2, "the victim names its key's handle");
    cr_assert_eq(ipcc_legacy_table_entries(cache), 2);
}
