/*
 * test_evict.c - idle mappings are bounded: past either cap the least
 * recently used idle mapping is really closed, in its own context.
 */
#include <pthread.h>
#include <unistd.h>
#include "testutil.h"

/* With room for two idle entries, closing a third evicts the oldest. */
Test(evict, entry_cap_evicts_least_recently_used, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "2", 1);
    tu_context();
    CUdeviceptr a = tu_open(tu_handle(30, 4096));
    CUdeviceptr b = tu_open(tu_handle(31, 4096));
    CUdeviceptr c = tu_open(tu_handle(32, 4096));
    tu_close(a);
    tu_close(b);
    tu_close(c);
    cr_assert_eq(tu_driver().unmaps, 1);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0, "the oldest idle entry went");
    cr_assert_eq(fakecuda_refcount(NULL, c), 1);
    tu_open(tu_handle(30, 4096));
    cr_assert_eq(tu_driver().maps, 4, "an evicted handle maps again");
}

/* Reuse refreshes recency: the entry touched last is kept. */
Test(evict, reuse_refreshes_recency, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "2", 1);
    tu_context();
    CUipcMemHandle ha = tu_handle(33, 4096), hb = tu_handle(34, 4096);
    CUdeviceptr a = tu_open(ha), b = tu_open(hb);
    tu_close(a);
    tu_close(b);
    tu_close(tu_open(ha)); /* a is now the most recent */
    tu_close(tu_open(tu_handle(35, 4096)));
    cr_assert_eq(fakecuda_refcount(NULL, b), 0);
    cr_assert_eq(fakecuda_refcount(NULL, a), 1);
}

/* The byte cap counts mapping sizes from the driver. */
Test(evict, byte_cap_evicts, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_BYTES", "3M", 1);
    tu_context();
    CUdeviceptr a = tu_open(tu_handle(36, 2 << 20));
    CUdeviceptr b = tu_open(tu_handle(37, 2 << 20));
    tu_close(a);
    cr_assert_eq(tu_driver().unmaps, 0, "2 MiB idle fits under 3 MiB");
    tu_close(b);
    cr_assert_eq(tu_driver().unmaps, 1);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0);
    cr_assert_eq(fakecuda_refcount(NULL, b), 1);
}

/* Live mappings are never evicted, whatever the caps. */
Test(evict, live_mappings_are_never_evicted, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "0", 1);
    tu_context();
    CUdeviceptr a = tu_open(tu_handle(38, 4096));
    CUdeviceptr b = tu_open(tu_handle(39, 4096));
    tu_close(b);
    cr_assert_eq(fakecuda_refcount(NULL, a), 1);
    cr_assert_eq(fakecuda_refcount(NULL, b), 0, "cap 0 keeps nothing idle");
}

/* An entry of another context is closed in that context, and ours stays current. */
Test(evict, evicts_in_the_entrys_own_context, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "1", 1);
    CUcontext c1 = tu_context();
    CUdeviceptr a = tu_open(tu_handle(40, 4096));
    tu_close(a);
    CUcontext c2 = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 1), CUDA_SUCCESS);
    CUdeviceptr b = tu_open(tu_handle(41, 4096));
    tu_close(b);
    cr_assert_eq(fakecuda_refcount(c1, a), 0, "closed in its own context");
    cr_assert_eq(fakecuda_refcount(c2, b), 1);
    CUcontext now = NULL;
    cuCtxGetCurrent(&now);
    cr_assert_eq(now, c2);
}

struct successor {
    CUcontext dead, born;
    CUipcMemHandle handle;
    CUdeviceptr ptr;
    CUresult rc;
};

/* What another thread may do while an eviction is between taking its victim
 * and closing it: destroy the victim's context, create one at its address
 * and open the same handle there (same pointer, a mapping of the new one). */
static void replace_context(void *arg)
{
    struct successor *s = arg;
    CUcontext popped;
    cr_assert_eq(cuCtxDestroy(s->dead), CUDA_SUCCESS);
    cr_assert_eq(cuCtxCreate_v2(&s->born, 0, 0), CUDA_SUCCESS);
    s->rc = cuIpcOpenMemHandle(&s->ptr, s->handle, 1);
    cr_assert_eq(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
}

/* An eviction whose victim's context died (and was reborn at its address)
 * after the victim was taken closes nothing in the newcomer. */
Test(evict, never_closes_in_a_successor_context, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "1", 1);
    struct successor s = { .handle = tu_handle(42, 4096) };
    s.dead = tu_context();
    CUdeviceptr a = tu_open(s.handle);
    tu_close(a);
    CUcontext c2 = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 1), CUDA_SUCCESS);
    CUdeviceptr b = tu_open(tu_handle(43, 4096));
    fakecuda_on_next_push(replace_context, &s);
    tu_close(b); /* two idle: evicts a, in its (dead) context */
    cr_assert_eq(s.born, s.dead, "the stand-in reuses the address");
    cr_assert_eq(s.rc, CUDA_SUCCESS);
    cr_assert_eq(s.ptr, a, "the new mapping is where the old one was");
    cr_assert_eq(fakecuda_refcount(s.born, s.ptr), 1, "the application's mapping stays");
    CUcontext now = NULL;
    cuCtxGetCurrent(&now);
    cr_assert_eq(now, c2);
}

struct late_close {
    CUcontext ctx;
    CUdeviceptr ptr;
    pthread_t thread;
    CUresult rc;
};

static void *close_again(void *arg)
{
    struct late_close *l = arg;
    cuCtxSetCurrent(l->ctx);
    l->rc = cuIpcCloseMemHandle(l->ptr);
    return NULL;
}

/* Another thread's extra close of the victim, while the eviction is between
 * taking it and closing it, runs meanwhile (the sleep gives it time). */
static void close_meanwhile(void *arg)
{
    struct late_close *l = arg;
    cr_assert_eq(pthread_create(&l->thread, NULL, close_again, l), 0);
    usleep(100 * 1000);
}

/* A close of a pointer the application has already closed gets the driver's
 * answer (invalid value) even while an eviction is closing that mapping: it
 * waits for the eviction instead of taking the cache's own reference. */
Test(evict, extra_close_during_eviction_is_the_drivers_error, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "1", 1);
    struct late_close l = { .ctx = tu_context() };
    l.ptr = tu_open(tu_handle(44, 4096));
    tu_close(l.ptr); /* idle in l.ctx */
    CUcontext c2 = NULL;
    cr_assert_eq(cuCtxCreate_v2(&c2, 0, 1), CUDA_SUCCESS);
    CUdeviceptr b = tu_open(tu_handle(45, 4096));
    fakecuda_on_next_push(close_meanwhile, &l);
    tu_close(b); /* two idle: evicts l.ptr, pushing its context */
    cr_assert_eq(pthread_join(l.thread, NULL), 0);
    cr_assert_eq(l.rc, CUDA_ERROR_INVALID_VALUE, "the driver alone says %d, got %d",
                 CUDA_ERROR_INVALID_VALUE, l.rc);
    cr_assert_eq(fakecuda_refcount(l.ctx, l.ptr), 0);
}

/* A close without the lock (of the entry lent to this thread, ordered by a
 * coarse clock) still counts as after this thread's earlier closes: here c,
 * lent since its open, is closed after a, so a is the older one and goes. */
Test(evict, lent_close_keeps_the_threads_order, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "2", 1);
    tu_context();
    CUdeviceptr a = tu_open(tu_handle(35, 4096));
    CUdeviceptr c = tu_open(tu_handle(36, 4096)); /* lent from here on */
    tu_close(a);
    tu_close(c);
    tu_close(tu_open(tu_handle(37, 4096)));
    cr_assert_eq(tu_driver().unmaps, 1);
    cr_assert_eq(fakecuda_refcount(NULL, a), 0, "the older idle entry went");
    cr_assert_eq(fakecuda_refcount(NULL, c), 1, "the entry closed last stayed");
}

/* No room in the budget, nothing lent: with no idle entry allowed every
 * close, repeated ones included, really closes. */
Test(evict, nothing_lent_without_room, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "0", 1);
    tu_context();
    CUipcMemHandle h = tu_handle(38, 4096);
    for (int i = 0; i < 4; i++)
        tu_close(tu_open(h));
    cr_assert_eq(tu_driver().maps, 4);
    cr_assert_eq(tu_driver().unmaps, 4);
}

/* The same when the byte cap is the one that binds: room for 2 KiB, not
 * for the mapping's 4 KiB, nothing lent (a hit while it is live would lend
 * it), whatever room the entry cap leaves. */
Test(evict, nothing_lent_without_room_for_its_bytes, .timeout = 10)
{
    setenv("IPCCACHE_MAX_IDLE_BYTES", "2048", 1);
    tu_context();
    CUipcMemHandle h = tu_handle(39, 4096);
    for (int i = 0; i < 4; i++) {
        CUdeviceptr p = tu_open(h);
        cr_assert_eq(tu_open(h), p, "a hit while live");
        tu_close(p);
        tu_close(p);
        cr_assert_eq(tu_driver().unmaps, (unsigned)i + 1, "round %d: the last close keeps it", i);
    }
    cr_assert_eq(tu_driver().maps, 4);
}
