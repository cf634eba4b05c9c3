/*
 * keyset.c - a small set of 64-byte keys: the VMM export tags an exporter
 * freed while the program still used them, so that the program's last
 * release of one really lets it go (legacy mappings carry that mark in
 * their table entry instead).
 *
 * Fixed size: a set that is full refuses (that allocation then stays mapped
 * until eviction or exit, as without the release ledger). Changes happen
 * under the table lock; the count alone is read without it, so that the
 * program's every close pays one relaxed load while the set is empty. A
 * sweep, after such a close, lets go of what went idle.
 */
#include <string.h>

#include "keyset.h"
#include "lock.h"

static long index_of(const struct ipcc_keyset *s, const void *key, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(s->key[i], key, IPCC_HANDLE_BYTES) == 0)
            return (long)i;
    return -1;
}

/* 0: key is in the set (now or already); -1: the set is full. */
int ipcc_keyset_add(struct ipcc_keyset *s, const void *key)
{
    size_t n = atomic_load_explicit(&s->n, memory_order_relaxed);
    if (index_of(s, key, n) >= 0)
        return 0;
    if (n == IPCC_KEYSET_MAX)
        return -1;
    memcpy(s->key[n], key, IPCC_HANDLE_BYTES);
    atomic_store_explicit(&s->n, n + 1, memory_order_release);
    return 0;
}

/* 1: key was in the set and is gone; the last key takes its place. */
int ipcc_keyset_remove(struct ipcc_keyset *s, const void *key)
{
    size_t n = atomic_load_explicit(&s->n, memory_order_relaxed);
    long i = index_of(s, key, n);
    if (i < 0)
        return 0;
    memmove(s->key[i], s->key[n - 1], IPCC_HANDLE_BYTES);
    atomic_store_explicit(&s->n, n - 1, memory_order_release);
    return 1;
}

/* Without the lock: whether there is anything to look at. */
size_t ipcc_keyset_count(struct ipcc_keyset *s)
{
    return atomic_load_explicit(&s->n, memory_order_relaxed);
}

/* Copies the keys to out (IPCC_KEYSET_MAX of them fit); how many. */
size_t ipcc_keyset_copy(struct ipcc_keyset *s, unsigned char (*out)[IPCC_HANDLE_BYTES])
{
    size_t n = atomic_load_explicit(&s->n, memory_order_relaxed);
    memcpy(out, s->key, n * IPCC_HANDLE_BYTES);
    return n;
}

/*
 * For each key, let_go really releases what is idle of it and returns the
 * bytes still in use, *in_use set when the program still uses some; keys
 * nothing uses any more leave the set. Takes the table lock itself, never
 * across let_go (which calls the driver). Returns the bytes still in use.
 */
uint64_t ipcc_keyset_sweep(struct ipcc_keyset *s, ipcc_keyset_let_go_fn let_go, void *arg)
{
    unsigned char copy[IPCC_KEYSET_MAX][IPCC_HANDLE_BYTES];
    ipcc_lock();
    size_t n = ipcc_keyset_copy(s, copy);
    ipcc_unlock();
    uint64_t still = 0;
    for (size_t i = 0; i < n; i++) {
        int in_use = 0;
        still += let_go(copy[i], &in_use, arg);
        if (!in_use) {
            ipcc_lock();
            ipcc_keyset_remove(s, copy[i]);
            ipcc_unlock();
        }
    }
    return still;
}

void ipcc_keyset_reset(struct ipcc_keyset *s)
{
    atomic_store(&s->n, 0);
}
