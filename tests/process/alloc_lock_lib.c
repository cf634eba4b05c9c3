/*
 * alloc_lock_lib.c - preloaded ahead of ipccache by tests/process/probe.c's
 * "alloc_fork" scenario: an allocator with a lock of its own and a fork
 * handler that takes it (as jemalloc's does), registered after ipccache's,
 * so that POSIX runs its prepare step first. It widens, for sure, the moment
 * a thread that holds a lock of ipccache's allocates while another forks:
 * the allocation waits until the fork's prepare step took the allocator's
 * lock, then takes it too.
 *
 *   alloc_lock_arm()        registers the fork handler; the next allocation
 *                           made while ipccache holds one of its mutexes on
 *                           that thread is the widened one
 *   alloc_lock_wait_open()  1 once a widened allocation is under way; 0 after 3 s
 *
 * ipccache's mutexes are told by the caller of pthread_mutex_lock/unlock:
 * an address inside libipccache.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT void alloc_lock_arm(void);
EXPORT int alloc_lock_wait_open(void);

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern int __pthread_mutex_lock(pthread_mutex_t *);
extern int __pthread_mutex_unlock(pthread_mutex_t *);

static pthread_mutex_t heap = PTHREAD_MUTEX_INITIALIZER;
static atomic_int armed, opened, preparing;
static uintptr_t lib_lo, lib_hi; /* libipccache's mapped range */
static __thread int ipccache_mutexes; /* held by this thread, taken by ipccache */

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
    if (!ipccache_mutexes || !atomic_exchange(&armed, 0))
        return;
    atomic_store(&opened, 1);
    for (int i = 0; i < 3000 && !atomic_load(&preparing); i++)
        sleep_ms(1);
}

static void heap_lock(void)
{
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

static int from_ipccache(const void *caller)
{
    uintptr_t a = (uintptr_t)caller;
    return a >= lib_lo && a < lib_hi;
}

EXPORT int pthread_mutex_lock(pthread_mutex_t *m)
{
    int rc = __pthread_mutex_lock(m);
    if (rc == 0 && from_ipccache(__builtin_return_address(0)))
        ipccache_mutexes++;
    return rc;
}

EXPORT int pthread_mutex_trylock(pthread_mutex_t *m)
{
    static int (*real)(pthread_mutex_t *);
    if (!real)
        real = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_trylock");
    int rc = real(m);
    if (rc == 0 && from_ipccache(__builtin_return_address(0)))
        ipccache_mutexes++;
    return rc;
}

EXPORT int pthread_mutex_unlock(pthread_mutex_t *m)
{
    if (from_ipccache(__builtin_return_address(0)) && ipccache_mutexes > 0)
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

void alloc_lock_arm(void)
{
    dl_iterate_phdr(find_ipccache, NULL);
    pthread_atfork(heap_prepare, heap_parent, heap_child);
    atomic_store(&armed, 1);
}

int alloc_lock_wait_open(void)
{
    for (int i = 0; i < 3000 && !atomic_load(&opened); i++)
        sleep_ms(1);
    return atomic_load(&opened);
}
