/*
 * mem.c - the memory of the tables: entries, uthash's buckets, the VMM
 * arrays. Drawn from pages of the library's own (mmap), never from the
 * program's allocator, because the tables grow under the table lock, which
 * the fork handlers take: an allocator whose fork handler registered after
 * ours runs it first and holds its own lock, so an allocation under the
 * table lock would wait for the forking thread while it waits for the table
 * lock (docs/limits.md, "Other interposers").
 *
 * Blocks of a power of two from 32 bytes to 64 KiB, carved from 1 MiB
 * regions and kept on a free list per size once freed (the tables' bounds
 * bound them); larger ones are a mapping each. Its lock is the innermost:
 * held for a list operation or an mmap, never across anything else, and the
 * fork handlers take it last (lifecycle.c). Signals wait while it is held:
 * a handler that forks must never find its own thread inside (the table
 * lock it may be inside is told apart, lock.c; this one need not be), and
 * it is taken seldom (a table's growth), never on a hit.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "mem.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define MIN_SHIFT 5   /* 32 bytes */
#define MAX_SHIFT 16  /* 64 KiB; larger blocks are mapped alone */
#define CLASSES (MAX_SHIFT - MIN_SHIFT + 1)
#define REGION (1u << 20)

/* Before each block; 16 bytes, so that blocks stay 16-byte aligned. */
struct head {
    size_t bytes;        /* usable; for a mapped block, the mapping less this */
    struct head *next;   /* on its free list */
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
/* Bytes of pages mapped here (regions and large blocks): the stats' mem_bytes. */
static _Atomic size_t mapped_bytes;
static struct head *free_list[CLASSES];
static char *carve, *carve_end; /* what is left of the newest region */

static void *map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    atomic_fetch_add_explicit(&mapped_bytes, bytes, memory_order_relaxed);
    return p;
}

/* What the tables' memory holds from the system: it only grows to the
 * highest the tables have needed, since freed blocks wait on their lists. */
size_t ipcc_mem_mapped(void)
{
    return atomic_load_explicit(&mapped_bytes, memory_order_relaxed);
}

static int class_of(size_t n)
{
    int c = 0;
    while (((size_t)1 << (MIN_SHIFT + c)) < n)
        c++;
    return c;
}

static void mem_lock_take(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, saved);
    pthread_mutex_lock(&mem_lock);
}

static void mem_lock_give(const sigset_t *saved)
{
    pthread_mutex_unlock(&mem_lock);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* Under mem_lock. A block of class c, from its list or a region. */
static struct head *take(int c)
{
    struct head *h = free_list[c];
    if (h) {
        free_list[c] = h->next;
        return h;
    }
    size_t need = sizeof(struct head) + ((size_t)1 << (MIN_SHIFT + c));
    if ((size_t)(carve_end - carve) < need) {
        char *r = map(REGION); /* the old region's rest is left unused */
        if (!r)
            return NULL;
        carve = r;
        carve_end = r + REGION;
    }
    h = (struct head *)(void *)carve;
    carve += need;
    h->bytes = (size_t)1 << (MIN_SHIFT + c);
    return h;
}

void *ipcc_mem_alloc(size_t n)
{
    struct head *h;
    if (n > ((size_t)1 << MAX_SHIFT)) {
        if (n > SIZE_MAX / 2 || !(h = map(sizeof(*h) + n)))
            return NULL;
        h->bytes = n;
    } else {
        sigset_t saved;
        mem_lock_take(&saved);
        h = take(class_of(n));
        mem_lock_give(&saved);
        if (!h)
            return NULL;
    }
    h->next = NULL;
    UNPOISON(h + 1, h->bytes);
    return h + 1;
}

void *ipcc_mem_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = ipcc_mem_alloc(n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void ipcc_mem_free(void *p)
{
    if (!p)
        return;
    struct head *h = (struct head *)p - 1;
    if (h->bytes > ((size_t)1 << MAX_SHIFT)) {
        size_t mapped = sizeof(*h) + h->bytes; /* read before the unmap */
        if (munmap(h, mapped) == 0)
            atomic_fetch_sub_explicit(&mapped_bytes, mapped, memory_order_relaxed);
        return;
    }
    POISON(p, h->bytes);
    int c = class_of(h->bytes);
    sigset_t saved;
    mem_lock_take(&saved);
    h->next = free_list[c];
    free_list[c] = h;
    mem_lock_give(&saved);
}

/* As realloc: the same block while n fits in it. */
void *ipcc_mem_realloc(void *p, size_t n)
{
    if (!p)
        return ipcc_mem_alloc(n);
    size_t had = ((struct head *)p - 1)->bytes;
    if (n <= had && had <= ((size_t)1 << MAX_SHIFT))
        return p;
    void *q = ipcc_mem_alloc(n);
    if (q) {
        memcpy(q, p, had < n ? had : n);
        ipcc_mem_free(p);
    }
    return q;
}

/* For the fork handlers: held from the prepare step to the parent's step;
 * the child resets it (the blocks stay as the fork found them). */
void ipcc_mem_hold(void)
{
    pthread_mutex_lock(&mem_lock);
}

void ipcc_mem_release(void)
{
    pthread_mutex_unlock(&mem_lock);
}

void ipcc_mem_reset(void)
{
    static const pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mem_lock = fresh;
}
