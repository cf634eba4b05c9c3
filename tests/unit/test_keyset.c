/*
 * test_keyset.c - the small set of 64-byte keys (shim/base/keyset.c) alone.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "base.h"

static struct ipcc_keyset set;

/* A key that differs from key(0) only in its last byte for i = 1. */
static const unsigned char *key(int i)
{
    static unsigned char k[IPCC_KEYSET_MAX + 8][IPCC_HANDLE_BYTES];
    memset(k[i], 0xab, IPCC_HANDLE_BYTES);
    k[i][IPCC_HANDLE_BYTES - 1] = (unsigned char)i;
    return k[i];
}

static void fresh(void)
{
    memset(&set, 0, sizeof(set));
}

/* Adding twice keeps one copy; keys that differ in their last byte are two. */
Test(keyset, add_is_idempotent_and_exact, .init = fresh, .timeout = 10)
{
    cr_assert_eq(ipcc_keyset_add(&set, key(0)), 0);
    cr_assert_eq(ipcc_keyset_add(&set, key(0)), 0);
    cr_assert_eq(ipcc_keyset_count(&set), 1);
    cr_assert_eq(ipcc_keyset_add(&set, key(1)), 0);
    cr_assert_eq(ipcc_keyset_count(&set), 2);
}

/* Removing one key keeps the others; removing an absent key says so. */
Test(keyset, remove_keeps_the_rest, .init = fresh, .timeout = 10)
{
    for (int i = 0; i < 3; i++)
        ipcc_keyset_add(&set, key(i));
    cr_assert_eq(ipcc_keyset_remove(&set, key(0)), 1);
    cr_assert_eq(ipcc_keyset_remove(&set, key(0)), 0);
    unsigned char copy[IPCC_KEYSET_MAX][IPCC_HANDLE_BYTES];
    cr_assert_eq(ipcc_keyset_copy(&set, copy), 2);
    int seen1 = 0, seen2 = 0;
    for (int i = 0; i < 2; i++) {
        seen1 |= memcmp(copy[i], key(1), IPCC_HANDLE_BYTES) == 0;
        seen2 |= memcmp(copy[i], key(2), IPCC_HANDLE_BYTES) == 0;
    }
    cr_assert(seen1 && seen2);
}

/* A full set refuses a new key but still knows the ones it holds. */
Test(keyset, full_set_refuses_new_keys, .init = fresh, .timeout = 10)
{
    for (int i = 0; i < IPCC_KEYSET_MAX; i++)
        cr_assert_eq(ipcc_keyset_add(&set, key(i)), 0);
    cr_assert_eq(ipcc_keyset_add(&set, key(IPCC_KEYSET_MAX)), -1);
    cr_assert_eq(ipcc_keyset_add(&set, key(5)), 0, "already there");
    cr_assert_eq(ipcc_keyset_count(&set), IPCC_KEYSET_MAX);
    ipcc_keyset_reset(&set);
    cr_assert_eq(ipcc_keyset_count(&set), 0);
}

static uint64_t still_used(const unsigned char *key, int *in_use, void *arg)
{
    int *calls = arg;
    (*calls)++;
    *in_use = key[IPCC_HANDLE_BYTES - 1] % 2; /* odd keys: still in use */
    return *in_use ? 100 : 0;
}

/* A sweep asks about every key, keeps those still in use and sums their bytes. */
Test(keyset, sweep_keeps_what_is_still_used, .init = fresh, .timeout = 10)
{
    for (int i = 0; i < 5; i++)
        ipcc_keyset_add(&set, key(i));
    int calls = 0;
    cr_assert_eq(ipcc_keyset_sweep(&set, still_used, &calls), 200);
    cr_assert_eq(calls, 5);
    cr_assert_eq(ipcc_keyset_count(&set), 2);
    cr_assert_eq(ipcc_keyset_remove(&set, key(1)), 1);
    cr_assert_eq(ipcc_keyset_remove(&set, key(3)), 1);
}
