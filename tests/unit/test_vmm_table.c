/*
 * test_vmm_table.c - the VMM path's table alone (shim/tables/vmm_table.c, vmm_ranges.c; the
 * predictor: test_vmm_predict.c): no CUDA,
 * no preload. File descriptions are played by numbers: desc[fd] is the
 * description fd names, and the comparator orders those as kcmp would.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "vmm_table_impl.h"

#define G (2ULL << 20)

static int desc[4096];
static int compares;
static int refuse;

static int cmp_desc(int a, int b)
{
    compares++;
    if (refuse)
        return IPCC_VMM_CMP_FAILED;
    return desc[a] == desc[b] ? 0 : desc[a] < desc[b] ? -1 : 1;
}

/* Different descriptions, never ordered (kcmp's answer 3). */
static int cmp_unordered(int a, int b)
{
    return desc[a] == desc[b] ? 0 : IPCC_VMM_UNORDERED;
}

static struct ipcc_vmm_id fd_id(int fd, int description)
{
    struct ipcc_vmm_id id;
    memset(&id, 0, sizeof(id));
    id.fd = fd;
    desc[fd] = description;
    return id;
}

static struct ipcc_vmm_table *table(void)
{
    struct ipcc_vmm_table *t = ipcc_vmm_table_create(cmp_desc, NULL);
    cr_assert_not_null(t);
    return t;
}

/* Records an import of (fd, description) as handle. */
static void add(struct ipcc_vmm_table *t, int fd, int description, uint64_t handle)
{
    struct ipcc_vmm_id id = fd_id(fd, description);
    uint64_t cached = 0;
    cr_assert_eq(ipcc_vmm_import_insert(t, &id, handle, 1, &cached), 1);
}

static int find(struct ipcc_vmm_table *t, int fd, int description, uint64_t *handle)
{
    struct ipcc_vmm_id id = fd_id(fd, description);
    return ipcc_vmm_import_find(t, &id, 2, handle);
}

static uint64_t idle_entries(struct ipcc_vmm_table *t)
{
    return atomic_load(&ipcc_vmm_table_gauges(t)->idle_entries);
}

static uint64_t idle_bytes(struct ipcc_vmm_table *t)
{
    return atomic_load(&ipcc_vmm_table_gauges(t)->idle_bytes);
}

/* An fd naming a recorded description finds its handle, with a reference. */
Test(vmm_table, same_description_is_a_hit, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 7, 0xa1);
    uint64_t h = 0;
    cr_assert_eq(find(t, 5, 7, &h), 1);
    cr_assert_eq(h, 0xa1);
    cr_assert_eq(ipcc_vmm_release(t, 0xa1, 3), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_vmm_release(t, 0xa1, 3), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_vmm_release(t, 0xa1, 3), IPCC_RELEASE_PAST_ZERO);
    ipcc_vmm_table_destroy(t, NULL);
}

/* A recycled fd number naming another description is a miss. */
Test(vmm_table, recycled_fd_number_is_a_miss, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 7, 0xa1);
    uint64_t h = 0;
    cr_assert_eq(find(t, 5, 8, &h), 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Lookups among many imports take logarithmically many comparisons (plus
 * one with what fd 10 found last time). */
Test(vmm_table, lookup_is_a_binary_search, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    for (int i = 0; i < 1000; i++)
        add(t, 1000 + i, (i * 7919) % 1000 + 1, 0x1000 + (uint64_t)i);
    for (int i = 0; i < 1000; i += 37) {
        uint64_t h = 0;
        compares = 0;
        cr_assert_eq(find(t, 10, (i * 7919) % 1000 + 1, &h), 1);
        cr_assert_eq(h, 0x1000 + (uint64_t)i);
        cr_assert_leq(compares, 12, "%d comparisons", compares);
    }
    ipcc_vmm_table_destroy(t, NULL);
}

/* An asked fd whose number is a kept one's: the kept dup was closed by
 * someone else and the number reused, or the app passes our own fd. The
 * two numbers name one file now whatever was kept: never a hit, as a guess
 * or by the search. */
Test(vmm_table, fd_number_of_a_kept_dup_is_never_a_hit, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 700, 100, 0x1000);
    add(t, 701, 101, 0x2000);
    uint64_t h = 0;
    cr_assert_eq(find(t, 9, 100, &h), 1);
    cr_assert_eq(find(t, 9, 101, &h), 1); /* 700 then 701: guessed next time */
    cr_assert_eq(find(t, 9, 100, &h), 1);
    cr_assert_neq(find(t, 701, 200, &h), 1, "a guess compared 701 with itself");
    cr_assert_neq(find(t, 700, 201, &h), 1, "the search compared 700 with itself");
    ipcc_vmm_table_destroy(t, NULL);
}

/* Imports asked for in the order of the time before (a rebuild's chunks,
 * always received as the same fd number) take one comparison each; another
 * order still finds them; a dropped import is predicted no more. */
Test(vmm_table, repeated_order_takes_one_comparison_each, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    for (int i = 0; i < 64; i++)
        add(t, 1000 + i, 500 + i, 0x1000 + (uint64_t)i);
    uint64_t h = 0;
    for (int i = 0; i < 64; i++)
        cr_assert_eq(find(t, 9, 500 + i, &h), 1);
    compares = 0;
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(find(t, 9, 500 + i, &h), 1);
        cr_assert_eq(h, 0x1000 + (uint64_t)i);
    }
    cr_assert_eq(compares, 64, "%d comparisons for 64 imports", compares);
    cr_assert_eq(find(t, 9, 530, &h), 1, "out of order");
    cr_assert_eq(h, 0x1000 + 30);
    cr_assert_eq(find(t, 9, 9999, &h), 0, "a description never imported");
    for (int k = 0; k < 3; k++) /* the insert's reference and two passes */
        cr_assert_eq(ipcc_vmm_release(t, 0x1000 + 31, 3), IPCC_RELEASE_OK);
    cr_assert_eq(find(t, 9, 530, &h), 1);
    struct ipcc_vmm_import *gone = ipcc_vmm_import_of(t, 0x1000 + 31);
    struct ipcc_vmm_ops ops = { 0 };
    ipcc_vmm_drop_import(t, gone, &ops);
    cr_assert_neq(t->last_found, gone);
    for (int i = 0; i < 63; i++)
        cr_assert_neq(t->by_id[i]->next_found, gone, "a prediction left to freed memory");
    cr_assert_eq(find(t, 9, 531, &h), 0, "a dropped import is not found");
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* A weight sync's tensors share their boundary chunks: each rebuild imports
 * [first..last], the next one [last..], so a chunk comes twice in a row.
 * Once the order is known, every import still takes one comparison, or two
 * for the second of a pair - never a search. */
Test(vmm_table, chunk_shared_by_neighbours_is_predicted, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    enum { CHUNKS = 100, SPAN = 4 };
    for (int i = 0; i < CHUNKS; i++)
        add(t, 1000 + i, 500 + i, 0x1000 + (uint64_t)i);
    uint64_t h = 0;
    int imports = 0, repeats = 0;
    for (int pass = 0; pass < 3; pass++) {
        compares = 0;
        imports = repeats = 0;
        for (int first = 0; first + SPAN <= CHUNKS; first += SPAN - 1) {
            for (int i = first; i < first + SPAN; i++, imports++) {
                cr_assert_eq(find(t, 9, 500 + i, &h), 1);
                cr_assert_eq(h, 0x1000 + (uint64_t)i);
            }
            repeats += first > 0;
        }
    }
    cr_assert_eq(compares, imports + repeats, "%d comparisons for %d imports, %d repeated",
                 compares, imports, repeats);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Descriptions the comparator cannot order are still found, by a scan. */
Test(vmm_table, unordered_descriptions_are_scanned, .timeout = 10)
{
    struct ipcc_vmm_table *t = ipcc_vmm_table_create(cmp_unordered, NULL);
    for (int i = 0; i < 20; i++)
        add(t, 200 + i, 50 + i, 0x200 + (uint64_t)i);
    uint64_t h = 0;
    cr_assert_eq(find(t, 9, 63, &h), 1);
    cr_assert_eq(h, 0x200 + 13);
    cr_assert_eq(find(t, 9, 99, &h), 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* A refused comparator makes identity undecidable: -1, never a guess. */
Test(vmm_table, refused_comparator_is_undecided, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 7, 0xa1);
    refuse = 1;
    uint64_t h = 0;
    cr_assert_eq(find(t, 5, 7, &h), -1);
    ipcc_vmm_table_destroy(t, NULL);
}

/* A second insert of one description (a racing thread) shares the first. */
Test(vmm_table, racing_insert_shares_the_first, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 7, 0xa1);
    struct ipcc_vmm_id id = fd_id(101, 7);
    uint64_t cached = 0;
    cr_assert_eq(ipcc_vmm_import_insert(t, &id, 0xb2, 1, &cached), 0);
    cr_assert_eq(cached, 0xa1);
    cr_assert_eq(ipcc_vmm_table_imports(t), 1);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Fabric handles are told apart by their bytes. */
Test(vmm_table, fabric_identity_is_the_bytes, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    struct ipcc_vmm_id a, b;
    memset(&a, 0, sizeof(a));
    a.fabric = 1;
    a.fd = -1;
    memset(a.bytes, 0x11, sizeof(a.bytes));
    b = a;
    b.bytes[63] = 0x12;
    uint64_t h = 0;
    cr_assert_eq(ipcc_vmm_import_insert(t, &a, 0xf1, 1, &h), 1);
    cr_assert_eq(ipcc_vmm_import_find(t, &b, 1, &h), 0);
    cr_assert_eq(ipcc_vmm_import_find(t, &a, 1, &h), 1);
    cr_assert_eq(h, 0xf1);
    ipcc_vmm_table_destroy(t, NULL);
}

/* ---- a rebuild: reserve R, chunks h1 at R, h2 at R+G ---------------------- */

#define R 0x500000000000ULL

static struct ipcc_vmm_table *built(void)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 1, 0xa1);
    add(t, 101, 2, 0xa2);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_reserve_track(t, R, 4 * G), 0);
    cr_assert_eq(ipcc_vmm_map(t, R, G, 0xa1, 1, &ops), IPCC_VMM_PASS);
    ipcc_vmm_map_done(t, R, G, 0xa1);
    cr_assert_eq(ipcc_vmm_map(t, R + G, G, 0xa2, 1, &ops), IPCC_VMM_PASS);
    ipcc_vmm_map_done(t, R + G, G, 0xa2);
    cr_assert_eq(ops.n, 0);
    return t;
}

/* The consumer's release: unmaps, releases, free; all kept, all idle. */
static void release_all(struct ipcc_vmm_table *t)
{
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_unmap(t, R, G, 5, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_unmap(t, R + G, G, 5, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_release(t, 0xa1, 5), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_vmm_release(t, 0xa2, 5), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_vmm_free(t, R, 4 * G, 5, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ops.n, 0);
}

/* An evicted import stays "released" until its real release is done: the
 * app's release past zero, or map, in that window must not reach the driver,
 * which still knows the handle (fuzz seed 258, another thread evicting). */
Test(vmm_table, evicted_import_is_released_until_really_released, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 1, 0xa1);
    cr_assert_eq(ipcc_vmm_release(t, 0xa1, 5), IPCC_RELEASE_OK);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_evict_one(t, &ops), 1);
    cr_assert_eq(ops.n, 1);
    cr_assert_eq(ops.v[0].op, IPCC_VMM_RELEASE);
    cr_assert_eq(ipcc_vmm_release(t, 0xa1, 6), IPCC_RELEASE_PAST_ZERO);
    cr_assert_eq(ipcc_vmm_import_released(t, 0xa1), 1);
    ipcc_vmm_release_done(t, 0xa1);
    cr_assert_eq(ipcc_vmm_release(t, 0xa1, 7), IPCC_RELEASE_NOT_FOUND);
    cr_assert_eq(ipcc_vmm_import_released(t, 0xa1), 0);
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* A tracked range the app frees while nothing is kept in it is forgotten at
 * once: after the driver's free another thread may get the same addresses,
 * and its new range must be the one found there (fuzz seed 2657). */
Test(vmm_table, freed_range_is_forgotten_before_the_driver_frees_it, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 1, 0xa1);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_reserve_track(t, R, 3 * G), 0);
    cr_assert_eq(ipcc_vmm_free(t, R, 3 * G, 2, &ops), IPCC_VMM_PASS, "the driver frees it");
    cr_assert_eq(ipcc_vmm_reserve_track(t, R, 5 * G), 0, "another thread's range, same place");
    cr_assert_eq(ipcc_vmm_map(t, R, G, 0xa1, 3, &ops), IPCC_VMM_PASS);
    ipcc_vmm_map_done(t, R, G, 0xa1);
    cr_assert_eq(ipcc_vmm_unmap(t, R, G, 4, &ops), IPCC_VMM_DONE, "kept");
    cr_assert_eq(ipcc_vmm_free(t, R, 5 * G, 5, &ops), IPCC_VMM_DONE, "its range, kept idle");
    cr_assert_eq(ops.n, 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Released and freed, the segment is idle; its imports count as idle bytes. */
Test(vmm_table, release_leaves_the_segment_idle, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    cr_assert_eq(idle_entries(t), 0);
    release_all(t);
    cr_assert_eq(idle_entries(t), 2);
    cr_assert_eq(idle_bytes(t), 2 * G);
    cr_assert_eq(atomic_load(&ipcc_vmm_table_gauges(t)->idle_reservations), 1);
    ipcc_vmm_table_destroy(t, NULL);
}

/* A rebuild after the same imports gets the range back and its maps are hits. */
Test(vmm_table, rebuild_reuses_the_range_and_mappings, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    release_all(t);
    uint64_t h = 0, addr = 0;
    cr_assert_eq(find(t, 7, 1, &h), 1);
    cr_assert_eq(find(t, 8, 2, &h), 1);
    const uint64_t recent[] = { 0xa1, 0xa2 };
    cr_assert_eq(ipcc_vmm_reserve_reuse(t, 4 * G, 0, recent, 2, 9, &addr), 1);
    cr_assert_eq(addr, R);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_map(t, R, G, 0xa1, 9, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_map(t, R + G, G, 0xa2, 9, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ops.n, 0);
    cr_assert_eq(idle_entries(t), 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* No reuse unless every kept chunk was just imported, and the size matches. */
Test(vmm_table, reuse_needs_every_chunk_and_the_size, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    release_all(t);
    uint64_t addr = 0;
    const uint64_t one[] = { 0xa1 }, both[] = { 0xa1, 0xa2 };
    cr_assert_eq(ipcc_vmm_reserve_reuse(t, 4 * G, 0, one, 1, 9, &addr), 0);
    cr_assert_eq(ipcc_vmm_reserve_reuse(t, 2 * G, 0, both, 2, 9, &addr), 0);
    cr_assert_eq(ipcc_vmm_reserve_reuse(t, 4 * G, 1ULL << 46, both, 2, 9, &addr), 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Another allocation mapped where a kept one sits: the kept one is unmapped first. */
Test(vmm_table, other_allocation_unmaps_the_kept_chunk, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    add(t, 102, 3, 0xa3);
    release_all(t);
    uint64_t addr = 0;
    const uint64_t recent[] = { 0xa1, 0xa2 };
    cr_assert_eq(ipcc_vmm_reserve_reuse(t, 4 * G, 0, recent, 2, 9, &addr), 1);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_map(t, R + G, G, 0xa3, 9, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ops.n, 1);
    cr_assert_eq(ops.v[0].op, IPCC_VMM_UNMAP);
    cr_assert_eq(ops.v[0].addr, R + G);
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Set-access is skipped only for exactly the access every chunk has. */
Test(vmm_table, access_skip_only_when_nothing_changes, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    struct ipcc_vmm_ops ops = { 0 };
    const struct ipcc_vmm_access rw0 = { 0, 3 }, rw1 = { 1, 3 }, ro0 = { 0, 1 };
    cr_assert_eq(ipcc_vmm_set_access(t, R, 2 * G, &rw0, 1, &ops), IPCC_VMM_PASS);
    ipcc_vmm_set_access_done(t, R, 2 * G, &rw0, 1);
    cr_assert_eq(ipcc_vmm_set_access(t, R, 2 * G, &rw0, 1, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_set_access(t, R, G, &rw0, 1, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_set_access(t, R, 2 * G, &rw1, 1, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ipcc_vmm_set_access(t, R, 2 * G, &ro0, 1, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ipcc_vmm_set_access(t, R, 3 * G, &rw0, 1, &ops), IPCC_VMM_PASS,
                 "a hole: the driver refuses it");
    cr_assert_eq(ipcc_vmm_set_access(t, R + G / 2, G, &rw0, 1, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ops.n, 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Access survives the keep: a rebuild asking for the same access skips it. */
Test(vmm_table, kept_access_is_remembered, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    const struct ipcc_vmm_access rw0 = { 0, 3 };
    ipcc_vmm_set_access_done(t, R, 2 * G, &rw0, 1);
    release_all(t);
    uint64_t h, addr;
    find(t, 7, 1, &h);
    find(t, 8, 2, &h);
    const uint64_t recent[] = { 0xa1, 0xa2 };
    cr_assert_eq(ipcc_vmm_reserve_reuse(t, 4 * G, 0, recent, 2, 9, &addr), 1);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_map(t, R, G, 0xa1, 9, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_map(t, R + G, G, 0xa2, 9, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_set_access(t, R, 2 * G, &rw0, 1, &ops), IPCC_VMM_DONE);
    ipcc_vmm_table_destroy(t, NULL);
}

/* The app freed the range: every call on it gets the driver's INVALID_VALUE. */
Test(vmm_table, freed_range_is_invalid, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    release_all(t);
    struct ipcc_vmm_ops ops = { 0 };
    const struct ipcc_vmm_access rw0 = { 0, 3 };
    cr_assert_eq(ipcc_vmm_map(t, R + 2 * G, G, 0xa1, 9, &ops), IPCC_VMM_INVALID);
    cr_assert_eq(ipcc_vmm_unmap(t, R, G, 9, &ops), IPCC_VMM_INVALID);
    cr_assert_eq(ipcc_vmm_set_access(t, R, G, &rw0, 1, &ops), IPCC_VMM_INVALID);
    cr_assert_eq(ipcc_vmm_free(t, R, 4 * G, 9, &ops), IPCC_VMM_INVALID);
    cr_assert_eq(ipcc_vmm_give_way(t, R, 1, &ops), IPCC_VMM_INVALID);
    cr_assert_eq(ops.n, 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Part of a mapping, or a free with a mapping left: the driver decides. */
Test(vmm_table, inexact_calls_go_to_the_driver, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_unmap(t, R, G / 2, 9, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ipcc_vmm_free(t, R, 4 * G, 9, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ipcc_vmm_unmap(t, R, G, 9, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_free(t, R, 2 * G, 9, &ops), IPCC_VMM_PASS, "wrong size");
    cr_assert_eq(ops.n, 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Reserving before importing (PyTorch's order): a map of an import tracks
 * the reservation (a map of memory not imported tracks nothing); a later
 * reserve gets the idle range whose last use mapped what followed the
 * thread's earlier rebuilds, wherever it lies, and only one of its size. */
Test(vmm_table, reserve_first_gets_the_range_of_what_follows, .timeout = 10)
{
    const uint64_t S = R + 64 * G;
    struct ipcc_vmm_table *t = built();
    add(t, 102, 3, 0xa3);
    cr_assert_eq(ipcc_vmm_reserve_mapped(t, R, 4 * G, R, 0xa1), 1, "tracked already");
    cr_assert_eq(ipcc_vmm_reserve_mapped(t, S, G, S, 0x99), 0, "the app's own");
    cr_assert_eq(ipcc_vmm_reserve_mapped(t, S, G, S, 0xa3), 1, "tracked from its first map");
    ipcc_vmm_map_done(t, S, G, 0xa3);
    release_all(t);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_unmap(t, S, G, 5, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_release(t, 0xa3, 5), IPCC_RELEASE_OK);
    cr_assert_eq(ipcc_vmm_free(t, S, G, 5, &ops), IPCC_VMM_DONE);
    /* The thread's rebuilds: R's (a1 at 0, a2 at G), then S's (a3 at 0). */
    uint64_t first = ipcc_vmm_rebuild_key(ipcc_vmm_rebuild_key(0, 0, 0xa1), G, 0xa2);
    uint64_t second = ipcc_vmm_rebuild_key(0, 0, 0xa3);
    struct ipcc_vmm_history h = { 0 }, other = { 0 };
    uint64_t addr = 0;
    ipcc_vmm_rebuild_done(t, &h, first);
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &h, 9, &addr), 0, "nothing learnt yet");
    ipcc_vmm_rebuild_done(t, &h, second);
    ipcc_vmm_rebuild_done(t, &h, first); /* the next step: S's rebuild follows R's */
    cr_assert_eq(ipcc_vmm_reserve_next(t, 2 * G, 0, &h, 9, &addr), 0, "size");
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &other, 9, &addr), 0, "no history");
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &h, 9, &addr), 1, "what followed");
    cr_assert_eq(addr, S);
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &h, 9, &addr), 0, "handed back already");
    ipcc_vmm_table_destroy(t, NULL);
}

/* The range handed back is found by what it holds: after a wrong guess put
 * another rebuild's mappings in it, the range now holding the predicted
 * rebuild's is the one handed back. */
Test(vmm_table, reserve_first_follows_what_a_range_holds_now, .timeout = 10)
{
    const uint64_t S = R + 64 * G;
    struct ipcc_vmm_table *t = table();
    add(t, 100, 1, 0xa1);
    add(t, 101, 2, 0xa2);
    struct ipcc_vmm_ops ops = { 0 };
    const uint64_t at[2] = { R, S }, handle[2] = { 0xa1, 0xa2 };
    for (int i = 0; i < 2; i++) { /* R holds a1, S holds a2, both idle */
        cr_assert_eq(ipcc_vmm_reserve_track(t, at[i], G), 0);
        cr_assert_eq(ipcc_vmm_map(t, at[i], G, handle[i], 1, &ops), IPCC_VMM_PASS);
        ipcc_vmm_map_done(t, at[i], G, handle[i]);
        cr_assert_eq(ipcc_vmm_unmap(t, at[i], G, 2, &ops), IPCC_VMM_DONE);
        cr_assert_eq(ipcc_vmm_free(t, at[i], G, 2 + (uint64_t)i, &ops), IPCC_VMM_DONE);
    }
    uint64_t k1 = ipcc_vmm_rebuild_key(0, 0, 0xa1), k2 = ipcc_vmm_rebuild_key(0, 0, 0xa2);
    struct ipcc_vmm_history h = { 0 };
    ipcc_vmm_rebuild_done(t, &h, k2);
    ipcc_vmm_rebuild_done(t, &h, k1); /* a1's rebuild follows a2's */
    ipcc_vmm_rebuild_done(t, &h, k2);
    uint64_t addr = 0;
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &h, 9, &addr), 1);
    cr_assert_eq(addr, R, "the range holding a1");
    /* A wrong guess: a2 mapped into R (a1 gives way), then R freed again. */
    cr_assert_eq(ipcc_vmm_map(t, R, G, 0xa2, 10, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ops.n, 1, "the kept a1 really unmapped first");
    ipcc_vmm_map_done(t, R, G, 0xa2);
    cr_assert_eq(ipcc_vmm_unmap(t, R, G, 11, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_free(t, R, G, 11, &ops), IPCC_VMM_DONE);
    ipcc_vmm_rebuild_done(t, &h, k1); /* a2 -> a1 learnt again; now after a1: a2 */
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &h, 12, &addr), 1);
    cr_assert_eq(addr, R, "the most recently used of the two holding a2");
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* With nothing predicted, a reserve-first rebuild gets a spare range (one
 * whose mappings another idle range holds too), so that orders nothing
 * predicts stop reserving more; never the only range holding something. */
Test(vmm_table, reserve_first_unpredicted_takes_a_spare, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 1, 0xa1);
    add(t, 101, 2, 0xa2);
    struct ipcc_vmm_ops ops = { 0 };
    const uint64_t at[3] = { R, R + 64 * G, R + 128 * G }, handle[3] = { 0xa1, 0xa2, 0xa2 };
    for (int i = 0; i < 3; i++) { /* a1, a2, a2 kept, idle */
        cr_assert_eq(ipcc_vmm_reserve_track(t, at[i], G), 0);
        cr_assert_eq(ipcc_vmm_map(t, at[i], G, handle[i], 1, &ops), IPCC_VMM_PASS);
        ipcc_vmm_map_done(t, at[i], G, handle[i]);
        cr_assert_eq(ipcc_vmm_unmap(t, at[i], G, 2, &ops), IPCC_VMM_DONE);
        cr_assert_eq(ipcc_vmm_free(t, at[i], G, 2, &ops), IPCC_VMM_DONE);
    }
    struct ipcc_vmm_history h = { 0 };
    uint64_t addr = 0;
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &h, 3, &addr), 1, "a spare");
    cr_assert(addr == at[1] || addr == at[2], "one of the two holding a2");
    cr_assert_eq(ipcc_vmm_reserve_next(t, G, 0, &h, 4, &addr), 0, "a1 and a2 held once each");
    cr_assert_eq(ops.n, 0);
    ipcc_vmm_table_destroy(t, NULL);
}

/* A range tracked only from a map into it may hold mappings the table never
 * saw: an unmap with holes, or a free while a hole remains, goes to the
 * driver (the free's kept chunks unmapped first, the range forgotten); filled
 * end to end, it is kept as any other. */
Test(vmm_table, blind_range_keeps_nothing_it_cannot_see, .timeout = 10)
{
    struct ipcc_vmm_table *t = table();
    add(t, 100, 1, 0xa1);
    add(t, 101, 2, 0xa2);
    const uint64_t B = R + 128 * G, S = R + 256 * G;
    cr_assert_neq(ipcc_vmm_reserve_mapped(t, B, 3 * G, B, 0xa1), 0);
    ipcc_vmm_map_done(t, B, G, 0xa1);
    ipcc_vmm_map_done(t, B + 2 * G, G, 0xa2);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_unmap(t, B, 3 * G, 5, &ops), IPCC_VMM_PASS, "a hole at B + G");
    cr_assert_eq(ipcc_vmm_unmap(t, B, G, 5, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ipcc_vmm_unmap(t, B + 2 * G, G, 5, &ops), IPCC_VMM_DONE);
    cr_assert_eq(ops.n, 0);
    cr_assert_eq(ipcc_vmm_free(t, B, 3 * G, 5, &ops), IPCC_VMM_PASS);
    cr_assert_eq(ops.n, 2, "both kept chunks unmapped before the driver decides");
    cr_assert_eq(ops.v[0].op, IPCC_VMM_UNMAP);
    cr_assert_eq(ops.v[1].op, IPCC_VMM_UNMAP);
    cr_assert_eq(ipcc_vmm_free(t, B, 3 * G, 6, &ops), IPCC_VMM_PASS, "forgotten");
    cr_assert_eq(ops.n, 2);
    cr_assert_neq(ipcc_vmm_reserve_mapped(t, S, 2 * G, S, 0xa1), 0);
    ipcc_vmm_map_done(t, S, G, 0xa1);
    ipcc_vmm_map_done(t, S + G, G, 0xa2);
    cr_assert_eq(ipcc_vmm_unmap(t, S, 2 * G, 7, &ops), IPCC_VMM_DONE, "no hole: kept");
    cr_assert_eq(ipcc_vmm_free(t, S, 2 * G, 7, &ops), IPCC_VMM_DONE, "filled: kept idle");
    cr_assert_eq(ops.n, 2);
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* Eviction takes the least recently used segment, whole, imports included. */
Test(vmm_table, eviction_tears_down_a_segment, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    release_all(t);
    struct ipcc_vmm_ops ops = { 0 };
    uint64_t ns;
    cr_assert(ipcc_vmm_oldest_idle(t, &ns), "an idle segment is there to evict");
    cr_assert_eq(ipcc_vmm_evict_one(t, &ops), 1);
    int unmaps = 0, frees = 0, releases = 0;
    for (size_t i = 0; i < ops.n; i++) {
        unmaps += ops.v[i].op == IPCC_VMM_UNMAP;
        frees += ops.v[i].op == IPCC_VMM_FREE;
        releases += ops.v[i].op == IPCC_VMM_RELEASE && ops.v[i].fd >= 100;
        cr_assert(ops.v[i].op != IPCC_VMM_UNMAP || frees == 0, "unmaps come before the free");
    }
    cr_assert_eq(unmaps, 2);
    cr_assert_eq(frees, 1);
    cr_assert_eq(releases, 2);
    cr_assert_eq(idle_entries(t), 0);
    cr_assert_eq(idle_bytes(t), 0);
    cr_assert_eq(ipcc_vmm_table_imports(t), 0);
    cr_assert_not(ipcc_vmm_oldest_idle(t, &ns));
    cr_assert_eq(ipcc_vmm_evict_one(t, &ops), 0);
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* An address hint on an idle range frees that range; the imports stay. */
Test(vmm_table, hint_on_idle_range_gives_way, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    release_all(t);
    struct ipcc_vmm_ops ops = { 0 };
    ipcc_vmm_clear_range(t, R + G, G, &ops);
    cr_assert_eq(ops.n, 3);
    cr_assert_eq(ops.v[2].op, IPCC_VMM_FREE);
    cr_assert_eq(ipcc_vmm_table_imports(t), 2);
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

static int closed[8], nclosed;
static void note_close(int fd)
{
    closed[nclosed++] = fd;
}

/* Clearing (a fork child) closes every kept dup and forgets everything. */
Test(vmm_table, clear_closes_kept_dups, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    ipcc_vmm_table_clear(t, note_close);
    cr_assert_eq(nclosed, 2);
    cr_assert_eq(ipcc_vmm_table_imports(t), 0);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_map(t, R, G, 0xa1, 1, &ops), IPCC_VMM_PASS);
    ipcc_vmm_table_destroy(t, NULL);
}

/* ---- an exporter's release: take what is idle of one export ------------------ */

static const unsigned char tag_a[IPCC_HANDLE_BYTES] = { 'a' }, tag_b[IPCC_HANDLE_BYTES] = { 'b' };

static int count_ops(const struct ipcc_vmm_ops *ops, enum ipcc_vmm_op op)
{
    int n = 0;
    for (size_t i = 0; i < ops->n; i++)
        n += ops->v[i].op == op;
    return n;
}

/* The export's idle segment is torn down and its import released; the other export's import stays cached. */
Test(vmm_table, take_idle_by_tag_tears_down_the_export, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    cr_assert_eq(ipcc_vmm_import_tag(t, 0xa1, tag_a), 1);
    cr_assert_eq(ipcc_vmm_import_tag(t, 0xa2, tag_b), 1);
    cr_assert_eq(ipcc_vmm_import_tag(t, 0xbad, tag_b), 0);
    release_all(t);
    struct ipcc_vmm_ops ops = { 0 };
    size_t live = 0;
    uint64_t live_bytes = 0;
    cr_assert_eq(ipcc_vmm_take_idle_by_tag(t, tag_a, &ops, &live, &live_bytes), 1);
    cr_assert_eq(live, 0);
    cr_assert_eq(count_ops(&ops, IPCC_VMM_UNMAP), 2);
    cr_assert_eq(count_ops(&ops, IPCC_VMM_FREE), 1);
    cr_assert_eq(count_ops(&ops, IPCC_VMM_RELEASE), 1);
    cr_assert_eq(ops.v[ops.n - 1].handle, 0xa1);
    cr_assert_eq(ipcc_vmm_table_imports(t), 1);
    uint64_t h = 0;
    cr_assert_eq(find(t, 7, 2, &h), 1, "the other export's import was dropped");
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* An import the app still maps is left alone and reported; its kept neighbour's chunk of the export gives way. */
Test(vmm_table, take_idle_by_tag_leaves_what_the_app_uses, .timeout = 10)
{
    struct ipcc_vmm_table *t = built();
    cr_assert_eq(ipcc_vmm_import_tag(t, 0xa1, tag_a), 1);
    cr_assert_eq(ipcc_vmm_import_tag(t, 0xa2, tag_a), 1);
    struct ipcc_vmm_ops ops = { 0 };
    cr_assert_eq(ipcc_vmm_unmap(t, R + G, G, 5, &ops), IPCC_VMM_DONE); /* kept, range live */
    cr_assert_eq(ipcc_vmm_release(t, 0xa2, 5), IPCC_RELEASE_OK);
    size_t live = 0;
    uint64_t live_bytes = 0;
    cr_assert_eq(ipcc_vmm_take_idle_by_tag(t, tag_a, &ops, &live, &live_bytes), 1);
    cr_assert_eq(live, 1);
    cr_assert_eq(live_bytes, G);
    cr_assert_eq(ops.n, 2);
    cr_assert_eq(ops.v[0].op, IPCC_VMM_UNMAP);
    cr_assert_eq(ops.v[0].addr, R + G);
    cr_assert_eq(ops.v[1].op, IPCC_VMM_RELEASE);
    cr_assert_eq(ops.v[1].handle, 0xa2);
    ipcc_mem_free(ops.v);
    ipcc_vmm_table_destroy(t, NULL);
}

/* The equality test the library has (fcntl F_DUPFD_QUERY) checks the guesses
 * instead of the ordering comparator; where it cannot tell (-1: an older
 * kernel), the comparator does. */
static int equalities;
static int cannot_tell;

static int same_desc(int a, int b)
{
    equalities++;
    return cannot_tell ? -1 : desc[a] == desc[b];
}

Test(vmm_table, guesses_are_checked_by_the_equality_test, .timeout = 10)
{
    struct ipcc_vmm_table *t = ipcc_vmm_table_create(cmp_desc, same_desc);
    cr_assert_not_null(t);
    for (int i = 0; i < 64; i++)
        add(t, 1000 + i, 500 + i, 0x1000 + (uint64_t)i);
    uint64_t h = 0;
    for (int i = 0; i < 64; i++)
        cr_assert_eq(find(t, 9, 500 + i, &h), 1);
    compares = equalities = 0;
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(find(t, 9, 500 + i, &h), 1);
        cr_assert_eq(h, 0x1000 + (uint64_t)i);
    }
    cr_assert_eq(equalities, 64, "%d equality tests for 64 imports", equalities);
    cr_assert_eq(compares, 0, "%d ordering comparisons", compares);
    cr_assert_eq(find(t, 9, 9999, &h), 0, "a description never imported");
    cannot_tell = 1;
    compares = 0;
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(find(t, 9, 500 + i, &h), 1);
        cr_assert_eq(h, 0x1000 + (uint64_t)i);
    }
    cannot_tell = 0;
    cr_assert_eq(compares, 64, "%d comparisons once the equality test cannot tell", compares);
    ipcc_vmm_table_destroy(t, NULL);
}
