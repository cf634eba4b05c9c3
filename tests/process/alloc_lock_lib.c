/*
 * alloc_lock_lib.c - preloaded ahead of ipccache by tests/process/probe.c's
 * "alloc_fork" scenarios: an allocator with a lock of its own and a fork
 * handler that takes it (as jemalloc's does), registered after ipccache's,
 * so that POSIX runs its prepare step first. It widens, for sure, the moment
 * a thread that holds a lock of ipccache's allocates, or takes a second one
 * of ipccache's (its tables' memory, inside the table lock), while another
 * forks: the thread waits until the fork's prepare step took the allocator's
 * lock, then goes on.
 *
 *   alloc_lock_arm()        registers the fork handler; the next allocation,
 *                           or nested lock, made while ipccache holds one of
 *                           its mutexes on that thread is the widened one
 *   alloc_lock_arm_registration()  the same, but the widened one is an
 *                           allocation inside the exit handlers' registration
 *   alloc_lock_wait_open()  1 once a widened moment is under way; 0 after 3 s
 *   alloc_lock_fill_exit_block()  registers exit handlers until the next
 *                           registration allocates (-1: not glibc's layout)
 *   alloc_lock_under_lock() allocator calls made while ipccache held one of
 *                           its mutexes (none should be: docs/limits.md)
 *
 * ALLOC_LOCK_REPORT=1: at exit, says on stderr how many allocator calls were
 * made under a lock of ipccache's, if any (then a quiet test fails).
 *
 * ipccache's mutexes are told by their address: each is a static of
 * libipccache's (the callers' addresses would not do: a tail call from a
 * function of ipccache's that the C library called hands back there).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

#include "exit_registration.h"

EXPORT void alloc_lock_arm(void);
EXPORT void alloc_lock_arm_registration(void);
EXPORT int alloc_lock_wait_open(void);
EXPORT int alloc_lock_fill_exit_block(void);
EXPORT long alloc_lock_under_lock(void);

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern int __pthread_mutex_lock(pthread_mutex_t *);
extern int __pthread_mutex_unlock(pthread_mutex_t *);

static pthread_mutex_t heap = PTHREAD_MUTEX_INITIALIZER;
static atomic_int armed, opened, preparing, in_registration_only;
static uintptr_t lib_lo, lib_hi; /* libipccache's mapped range */
static __thread int ipccache_mutexes; /* held by this thread, taken by ipccache */
static atomic_long under_lock;         /* allocator calls while it held one */
static atomic_long registration_allocs; /* allocator calls inside __cxa_atexit */

static void sleep_ms(long ms)
{
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&t, &t) != 0)
        ;
}

/* ---- the allocator ------------------------------------------------------ */

/* The widened allocation: waits (3 s at most) until a fork's prepare step
 * holds the heap lock, then takes it like any allocation. */
static void widen(void)
{
    if (!ipccache_mutexes || (atomic_load(&in_registration_only) && !in_registration) ||
        !atomic_exchange(&armed, 0))
        return;
    atomic_store(&opened, 1);
    for (int i = 0; i < 3000 && !atomic_load(&preparing); i++)
        sleep_ms(1);
}

static void heap_lock(void)
{
    if (ipccache_mutexes)
        atomic_fetch_add(&under_lock, 1);
    if (in_registration)
        atomic_fetch_add(&registration_allocs, 1);
    widen();
    __pthread_mutex_lock(&heap);
}

EXPORT void *malloc(size_t n)
{
    heap_lock();
    void *p = __libc_malloc(n);
    __pthread_mutex_unlock(&heap);
    return p;
}

EXPORT void *calloc(size_t n, size_t size)
{
    heap_lock();
    void *p = __libc_calloc(n, size);
    __pthread_mutex_unlock(&heap);
    return p;
}

EXPORT void *realloc(void *old, size_t n)
{
    heap_lock();
    void *p = __libc_realloc(old, n);
    __pthread_mutex_unlock(&heap);
    return p;
}

EXPORT void free(void *p)
{
    if (ipccache_mutexes && p)
        atomic_fetch_add(&under_lock, 1);
    __pthread_mutex_lock(&heap);
    __libc_free(p);
    __pthread_mutex_unlock(&heap);
}

static void heap_prepare(void)
{
    __pthread_mutex_lock(&heap);
    atomic_store(&preparing, 1);
}

static void heap_parent(void)
{
    atomic_store(&preparing, 0);
    __pthread_mutex_unlock(&heap);
}

static void heap_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    heap = fresh;
    atomic_store(&preparing, 0);
}

/* ---- ipccache's mutexes -------------------------------------------------- */

static int from_ipccache(const void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    return a >= lib_lo && a < lib_hi;
}

/* A lock of ipccache's taken inside another: its tables' memory (mem.c),
 * where it allocates under the table lock, is widened too. */
EXPORT int pthread_mutex_lock(pthread_mutex_t *m)
{
    int ours = from_ipccache(m);
    if (ours)
        widen();
    int rc = __pthread_mutex_lock(m);
    if (rc == 0 && ours)
        ipccache_mutexes++;
    return rc;
}

EXPORT int pthread_mutex_trylock(pthread_mutex_t *m)
{
    static int (*real)(pthread_mutex_t *);
    if (!real)
        real = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_trylock");
    int rc = real(m);
    if (rc == 0 && from_ipccache(m))
        ipccache_mutexes++;
    return rc;
}

EXPORT int pthread_mutex_unlock(pthread_mutex_t *m)
{
    if (from_ipccache(m) && ipccache_mutexes > 0)
        ipccache_mutexes--;
    return __pthread_mutex_unlock(m);
}

/* ---- arming ---------------------------------------------------------------- */

static int find_ipccache(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libipccache"))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        lib_lo = lib_lo && lib_lo < lo ? lib_lo : lo;
        lib_hi = hi > lib_hi ? hi : lib_hi;
    }
    return 1;
}

/* ---- exit handlers ---------------------------------------------------------- */

static long registrations_allocs_so_far(void)
{
    return atomic_load(&registration_allocs);
}

int alloc_lock_fill_exit_block(void)
{
    return fill_exit_block(registrations_allocs_so_far);
}

long alloc_lock_under_lock(void)
{
    return atomic_load(&under_lock);
}

__attribute__((constructor)) static void find_at_load(void)
{
    dl_iterate_phdr(find_ipccache, NULL);
}

__attribute__((destructor)) static void report(void)
{
    long n = atomic_load(&under_lock);
    if (!getenv("ALLOC_LOCK_REPORT") || n == 0)
        return;
    char line[128];
    int len = snprintf(line, sizeof(line), "alloc_lock: %ld allocator calls under a lock of ipccache's\n", n);
    ssize_t ignored = write(2, line, (size_t)len);
    (void)ignored;
}

void alloc_lock_arm(void)
{
    pthread_atfork(heap_prepare, heap_parent, heap_child);
    atomic_store(&armed, 1);
}

void alloc_lock_arm_registration(void)
{
    atomic_store(&in_registration_only, 1);
    alloc_lock_arm();
}

int alloc_lock_wait_open(void)
{
    for (int i = 0; i < 3000 && !atomic_load(&opened); i++)
        sleep_ms(1);
    return atomic_load(&opened);
}
