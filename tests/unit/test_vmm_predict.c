/*
 * test_vmm_predict.c - which rebuild follows which (shim/tables/vmm_predict.c)
 * alone: no CUDA, no preload.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "vmm_table_impl.h"

#define G (2ULL << 20)

static uint64_t key_of(uint64_t handle)
{
    return ipcc_vmm_rebuild_key(0, 0, handle);
}

/* Plays keys[] n times over (reversed every other pass when asked) and
 * counts the rebuilds of the last pass whose key was predicted first. */
static int predicted_last_pass(const uint64_t *keys, int n, int passes, int reverse)
{
    struct ipcc_vmm_predict p = { 0 };
    struct ipcc_vmm_history h = { 0 };
    int hits = 0;
    for (int pass = 0; pass < passes; pass++) {
        for (int i = 0; i < n; i++) {
            uint64_t k = keys[reverse && pass % 2 ? n - 1 - i : i];
            if (pass == passes - 1)
                hits += ipcc_vmm_predict_next(&p, &h) == k;
            ipcc_vmm_predict_learn(&p, &h, k);
        }
    }
    ipcc_vmm_predict_clear(&p);
    return hits;
}

/* A rebuild's key is what it mapped, in any order, never 0; offsets count. */
Test(vmm_predict, key_is_what_was_mapped, .timeout = 10)
{
    uint64_t ab = ipcc_vmm_rebuild_key(ipcc_vmm_rebuild_key(0, 0, 0xa1), G, 0xa2);
    uint64_t ba = ipcc_vmm_rebuild_key(ipcc_vmm_rebuild_key(0, G, 0xa2), 0, 0xa1);
    cr_assert_eq(ab, ba);
    cr_assert_neq(ab, ipcc_vmm_rebuild_key(ipcc_vmm_rebuild_key(0, 0, 0xa2), G, 0xa1));
    cr_assert_neq(key_of(0xa1), ipcc_vmm_rebuild_key(0, G, 0xa1));
    cr_assert_neq(ipcc_vmm_rebuild_key(0, 0, 0), 0);
}

/* In-order shapes are predicted every time once seen: repeats of one key
 * (tensors in one chunk, two engines in turn) and orders that pass a key
 * going both ways (reversed every other step) included. */
Test(vmm_predict, in_order_shapes_predicted_once_seen, .timeout = 10)
{
    /* a layer: q, o, gate, down, norm, norm (the norms share a chunk) */
    uint64_t keys[64];
    int n = 0;
    for (int l = 0; l < 8; l++) {
        for (int k = 0; k < 4; k++)
            keys[n++] = key_of(0x100 + (uint64_t)l * 8 + (uint64_t)k);
        keys[n++] = key_of(0x1);
        keys[n++] = key_of(0x1);
    }
    cr_assert_eq(predicted_last_pass(keys, n, 3, 0), n, "one at a time");
    uint64_t twice[128];
    for (int i = 0; i < n; i++)
        twice[2 * i] = twice[2 * i + 1] = keys[i];
    cr_assert_eq(predicted_last_pass(twice, 2 * n, 3, 0), 2 * n, "two engines in turn");
    /* reversed every other pass: all but the turn, where the run of the
     * last key joins the next pass's */
    cr_assert_geq(predicted_last_pass(keys, n, 5, 1), n - 3, "reversed every other step");
}

/* A reserve with nothing imported since the last (the consumer growing its
 * own expandable segments between weight syncs) ends an empty rebuild: it
 * is learnt as nothing, so what was predicted before it still is, and
 * what followed each rebuild is not forgotten. */
Test(vmm_predict, empty_rebuild_changes_nothing, .timeout = 10)
{
    struct ipcc_vmm_predict p = { 0 };
    struct ipcc_vmm_history h = { 0 };
    uint64_t keys[6];
    for (int i = 0; i < 6; i++)
        keys[i] = key_of(0x300 + (uint64_t)i);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 6; i++)
            ipcc_vmm_predict_learn(&p, &h, keys[i]);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 6; i++) {
            cr_assert_eq(ipcc_vmm_predict_next(&p, &h), keys[i], "pass %d, rebuild %d", pass, i);
            ipcc_vmm_predict_learn(&p, &h, keys[i]);
            ipcc_vmm_predict_learn(&p, &h, 0); /* the app's own segment */
            ipcc_vmm_predict_learn(&p, &h, 0);
        }
    }
    ipcc_vmm_predict_clear(&p);
}

/* Nothing learnt, nothing predicted; the table grows past its first size
 * and keeps answering; a full one still learns (replacing). */
Test(vmm_predict, grows_and_forgets, .timeout = 10)
{
    struct ipcc_vmm_predict p = { 0 };
    struct ipcc_vmm_history h = { 0 };
    cr_assert_eq(ipcc_vmm_predict_next(&p, &h), 0);
    static uint64_t keys[40000];
    for (int i = 0; i < 40000; i++)
        keys[i] = key_of((uint64_t)i + 1);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 40000; i++)
            ipcc_vmm_predict_learn(&p, &h, keys[i]);
    int hits = 0;
    for (int i = 0; i < 40000; i++) {
        hits += ipcc_vmm_predict_next(&p, &h) == keys[i];
        ipcc_vmm_predict_learn(&p, &h, keys[i]);
    }
    cr_assert_gt(hits, 20000, "most of 80,000 contexts in 65,536 slots (%d)", hits);
    ipcc_vmm_predict_clear(&p);
    cr_assert_eq(ipcc_vmm_predict_next(&p, &h), 0, "cleared");
}
