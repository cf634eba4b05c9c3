/*
 * test_threads.c - concurrent opens and closes: no lost references, no
 * leaked mappings, and a slow real map does not hold up other threads.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>

#include "testutil.h"

#define THREADS 16
#define ROUNDS 2000
#define HANDLES 4

static CUcontext shared_ctx;

/* Each worker opens and closes a rotating set of handles, sometimes nested. */
static void *hammer(void *arg)
{
    long id = (long)arg;
    cuCtxSetCurrent(shared_ctx);
    for (int i = 0; i < ROUNDS; i++) {
        CUipcMemHandle h = tu_handle(100 + (uint64_t)((i + id) % HANDLES), 1 << 20);
        CUdeviceptr a = 0, b = 0;
        if (cuIpcOpenMemHandle(&a, h, 1) != CUDA_SUCCESS)
            return (void *)1;
        if (i % 7 == 0 && (cuIpcOpenMemHandle(&b, h, 1) != CUDA_SUCCESS || b != a ||
                           cuIpcCloseMemHandle(b) != CUDA_SUCCESS))
            return (void *)2;
        if (cuIpcCloseMemHandle(a) != CUDA_SUCCESS)
            return (void *)3;
    }
    return NULL;
}

/* 16 threads hammering 4 handles leave exactly one driver mapping each. */
Test(threads, hammering_keeps_one_mapping_per_handle, .timeout = 60)
{
    shared_ctx = tu_context();
    tu_run_threads(hammer, THREADS);
    cr_assert_eq(tu_driver().maps, HANDLES);
    cr_assert_eq(tu_driver().unmaps, 0);
    for (int i = 0; i < HANDLES; i++) {
        CUdeviceptr p = tu_open(tu_handle(100 + (uint64_t)i, 1 << 20));
        cr_assert_eq(fakecuda_refcount(NULL, p), 1, "handle %d", i);
        tu_close(p);
    }
}

static atomic_int racers_ready;

/* All threads miss on the same handle at once (the driver is slow). */
static void *race_same_handle(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(shared_ctx);
    atomic_fetch_add(&racers_ready, 1);
    while (atomic_load(&racers_ready) < 8)
        ;
    CUdeviceptr p = 0;
    if (cuIpcOpenMemHandle(&p, tu_handle(200, 1 << 20), 1) != CUDA_SUCCESS)
        return (void *)1;
    return cuIpcCloseMemHandle(p) == CUDA_SUCCESS ? NULL : (void *)2;
}

/* Concurrent misses on one handle leave one driver reference, not eight. */
Test(threads, concurrent_misses_leak_nothing, .timeout = 30)
{
    setenv("FAKECUDA_OPEN_DELAY_US", "50000", 1);
    shared_ctx = tu_context();
    tu_run_threads(race_same_handle, 8);
    CUdeviceptr p = tu_open(tu_handle(200, 1 << 20));
    cr_assert_eq(fakecuda_refcount(NULL, p), 1);
    tu_close(p);
    cr_assert_eq(tu_driver().maps, 1);
}

static atomic_int slow_open_done;

static void *slow_open(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(shared_ctx);
    CUdeviceptr p = 0;
    CUresult rc = cuIpcOpenMemHandle(&p, tu_handle(301, 1 << 20), 1);
    atomic_store(&slow_open_done, 1);
    return rc == CUDA_SUCCESS ? NULL : (void *)1;
}

/* While one thread waits 2 s in a real map, another thread's hits go on. */
Test(threads, slow_map_does_not_block_hits, .timeout = 30)
{
    shared_ctx = tu_context();
    CUipcMemHandle hot = tu_handle(300, 1 << 20);
    tu_close(tu_open(hot));
    setenv("FAKECUDA_OPEN_DELAY_US", "2000000", 1);
    pthread_t t;
    pthread_create(&t, NULL, slow_open, NULL);
    while (tu_driver().open_calls < 2 && !atomic_load(&slow_open_done))
        usleep(100); /* the slow open is inside the driver now */
    cr_assert_eq(tu_driver().open_calls, 2, "the other handle's open never reached the driver");
    for (int i = 0; i < 10000; i++)
        tu_close(tu_open(hot));
    cr_assert_eq(atomic_load(&slow_open_done), 0, "hits waited for the slow map");
    pthread_join(t, NULL);
}

static CUdeviceptr lent_ptr;
static atomic_int owner_ready, others_done;

/* Opens one handle until it is lent, keeps one reference and stays alive
 * (its loan with it) until the main thread is done. */
static void *open_and_keep(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(shared_ctx);
    CUipcMemHandle h = tu_handle(400, 1 << 20);
    void *ret = NULL;
    for (int i = 0; i < 3 && !ret; i++) { /* lent to this thread from the second on */
        CUdeviceptr p = 0;
        if (cuIpcOpenMemHandle(&p, h, 1) != CUDA_SUCCESS || cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
            ret = (void *)1;
    }
    if (!ret && cuIpcOpenMemHandle(&lent_ptr, h, 1) != CUDA_SUCCESS)
        ret = (void *)2;
    atomic_store(&owner_ready, 1);
    while (!atomic_load(&others_done))
        usleep(100);
    return ret;
}

/* One thread's loan (it keeps one reference) is taken back when another
 * opens and closes the entry: every reference is counted once, and the
 * third close is past zero, the driver's answer. */
Test(threads, loan_taken_back_by_another_thread, .timeout = 10)
{
    const char *stats = tu_stats_file();
    shared_ctx = tu_context();
    pthread_t t;
    void *ret;
    pthread_create(&t, NULL, open_and_keep, NULL);
    while (!atomic_load(&owner_ready))
        usleep(100);
    CUdeviceptr p = tu_open(tu_handle(400, 1 << 20));
    cr_assert_eq(p, lent_ptr);
    tu_close(p);
    tu_close(p); /* the other thread's reference */
    cr_assert_eq(fakecuda_refcount(NULL, p), 1, "idle, the cache's reference");
    raise(SIGUSR1);
    cr_assert_eq(tu_stat(stats, "live"), 0, "the loan's reference was counted twice");
    cr_assert_eq(tu_stat(stats, "idle"), 1);
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(fakecuda_refcount(NULL, p), 0);
    cr_assert_eq(tu_driver().maps, 1);
    atomic_store(&others_done, 1);
    pthread_join(t, &ret);
    cr_assert_null(ret);
}

#define TURNS 1000
static atomic_int turn;

/* Opens and closes handle 500 on its turns (of two threads), TURNS times. */
static void *pair_on_my_turns(void *arg)
{
    int me = (int)(long)arg;
    cuCtxSetCurrent(shared_ctx);
    CUipcMemHandle h = tu_handle(500, 1 << 20);
    for (int i = 0; i < TURNS; i++) {
        while (atomic_load(&turn) % 2 != me)
            sched_yield();
        CUdeviceptr p = 0;
        if (cuIpcOpenMemHandle(&p, h, 1) != CUDA_SUCCESS || cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
            return (void *)1;
        atomic_fetch_add(&turn, 1);
    }
    return NULL;
}

/* Two threads taking turns on one cached handle are both lent it: after
 * each one's first hit, none of their hits takes the lock (whatever the
 * cores: the turns leave no two calls at once), and every reference is
 * counted once. */
Test(threads, shared_handle_hits_take_no_lock, .timeout = 30)
{
    const char *stats = tu_stats_file();
    shared_ctx = tu_context();
    CUdeviceptr p = tu_open(tu_handle(500, 1 << 20));
    tu_close(p);
    tu_run_threads(pair_on_my_turns, 2);
    raise(SIGUSR1);
    cr_assert_eq(tu_stat(stats, "hits"), 2 * TURNS);
    cr_assert_leq(tu_stat(stats, "hits_locked"), 2, "hits took the lock: %lld of %d",
                  tu_stat(stats, "hits_locked"), 2 * TURNS);
    cr_assert_eq(tu_stat(stats, "live"), 0);
    cr_assert_eq(tu_stat(stats, "idle"), 1);
    cr_assert_eq(fakecuda_refcount(NULL, p), 1, "idle, the cache's reference");
    cr_assert_eq(tu_driver().maps, 1);
}

/* An entry lent to two threads counts once against the idle cap: with a cap
 * of 2 idle entries, it and one more stay cached, idle. */
Test(threads, shared_loan_counts_once_against_the_cap, .timeout = 30)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "2", 1);
    shared_ctx = tu_context();
    tu_close(tu_open(tu_handle(500, 1 << 20)));
    tu_run_threads(pair_on_my_turns, 2);
    tu_close(tu_open(tu_handle(501, 1 << 20)));
    cr_assert_eq(tu_driver().maps, 2);
    cr_assert_eq(tu_driver().unmaps, 0, "an idle entry was evicted under the cap");
}

static atomic_int holders_ready, holders_go;

/* Lent handle 502 (it hits it 3 times), keeps a 4th reference until told. */
static void *hit_and_hold(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(shared_ctx);
    CUipcMemHandle h = tu_handle(502, 1 << 20);
    CUdeviceptr p = 0;
    for (int i = 0; i < 3; i++)
        if (cuIpcOpenMemHandle(&p, h, 1) != CUDA_SUCCESS || cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
            return (void *)1;
    if (cuIpcOpenMemHandle(&p, h, 1) != CUDA_SUCCESS)
        return (void *)2;
    atomic_fetch_add(&holders_ready, 1);
    while (!atomic_load(&holders_go))
        usleep(100);
    return cuIpcCloseMemHandle(p) == CUDA_SUCCESS ? NULL : (void *)3;
}

/* Two threads lent one entry, a reference each: the stats line counts it
 * once, live, and its top slot has both threads' hits and references. */
Test(threads, shared_loan_counted_once_in_the_stats, .timeout = 30)
{
    const char *stats = tu_stats_file();
    shared_ctx = tu_context();
    tu_close(tu_open(tu_handle(502, 1 << 20)));
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, hit_and_hold, NULL), 0);
    while (atomic_load(&holders_ready) < 2)
        usleep(100);
    raise(SIGUSR1);
    atomic_store(&holders_go, 1);
    for (int i = 0; i < 2; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        cr_assert_null(ret);
    }
    cr_assert_eq(tu_stat(stats, "live"), 1, "the entry lent to two threads counts once");
    cr_assert_eq(tu_stat(stats, "idle"), 0);
    cr_assert_eq(tu_stat(stats, "hits"), 8);
    cr_assert_eq(tu_stat_after(stats, "\"top\":", "hits"), 8, "the loans' hits are in the top list");
    cr_assert_eq(tu_stat_after(stats, "\"top\":", "refs"), 2);
}

/* With the budget full, an entry lent to one thread is lent to the other
 * too (counted idle once, already): neither takes the lock on its hits. */
Test(threads, shared_handle_lent_with_the_budget_full, .timeout = 30)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "1", 1);
    const char *stats = tu_stats_file();
    shared_ctx = tu_context();
    tu_close(tu_open(tu_handle(500, 1 << 20)));
    tu_run_threads(pair_on_my_turns, 2);
    raise(SIGUSR1);
    cr_assert_leq(tu_stat(stats, "hits_locked"), 2, "hits took the lock: %lld of %d",
                  tu_stat(stats, "hits_locked"), 2 * TURNS);
}

/* ---- loans and the thread's life ------------------------------------------ */

#define PAIRS 100
#define CHURN 100 /* threads one after another: more than the 64 loan slots */
static pthread_key_t late_key;
static atomic_int late_failures;

/* n open/close pairs of handle 600 in the calling thread; 0 when all succeed. */
static int pairs_on_600(int n)
{
    CUipcMemHandle h = tu_handle(600, 1 << 20);
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        if (cuIpcOpenMemHandle(&p, h, 1) != CUDA_SUCCESS || cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
            return -1;
    }
    return 0;
}

/* How a thread of these tests runs: its pairs, and whether it arms late_key. */
enum { CHURNED, CHURNED_LATE_EXIT, MEASURED };

static void *pairs_then_exit(void *arg)
{
    long how = (long)arg;
    cuCtxSetCurrent(shared_ctx);
    if (how == CHURNED_LATE_EXIT && pthread_setspecific(late_key, &late_key) != 0)
        return (void *)1;
    return pairs_on_600(how == MEASURED ? PAIRS : 2) == 0 ? NULL : (void *)2;
}

/* CHURN threads, one after another, each lent handle 600, then exiting. */
static void churn(long how)
{
    for (int i = 0; i < CHURN; i++) {
        pthread_t t;
        void *ret;
        cr_assert_eq(pthread_create(&t, NULL, pairs_then_exit, (void *)how), 0);
        pthread_join(t, &ret);
        cr_assert_null(ret, "thread %d failed at step %ld", i, (long)ret);
    }
}

/* The locked hits of PAIRS open/close pairs of handle 600 in a new thread. */
static long long locked_hits_of_a_new_thread(const char *stats)
{
    pthread_t t;
    void *ret;
    raise(SIGUSR1);
    long long before = tu_stat(stats, "hits_locked");
    cr_assert_eq(pthread_create(&t, NULL, pairs_then_exit, (void *)MEASURED), 0);
    pthread_join(t, &ret);
    cr_assert_null(ret);
    raise(SIGUSR1);
    return tu_stat(stats, "hits_locked") - before;
}

/* Threads that exit give their loan slots back: after more threads than
 * slots have come and gone, a new thread's hits are lent again (one locked
 * hit, the rest without the lock). */
Test(threads, exited_threads_give_their_slots_back, .timeout = 30)
{
    const char *stats = tu_stats_file();
    shared_ctx = tu_context();
    tu_close(tu_open(tu_handle(600, 1 << 20)));
    churn(CHURNED);
    long long locked = locked_hits_of_a_new_thread(stats);
    cr_assert_leq(locked, 2, "%lld of %d hits took the lock", locked, PAIRS);
}

/* An exit destructor that runs after the library's: its key is made after
 * the library's (made at the first loan), and glibc runs a round's
 * destructors in the order their keys were made. */
static void ipc_at_late_exit(void *unused)
{
    (void)unused;
    if (pairs_on_600(2) != 0)
        atomic_fetch_add(&late_failures, 1);
}

/* Threads whose IPC calls go on in an exit destructor run after the
 * library's leave no loan slot taken: after more of them than slots, a new
 * thread's hits are still lent. */
Test(threads, ipc_in_a_late_exit_destructor_leaves_no_slot_taken, .timeout = 30)
{
    const char *stats = tu_stats_file();
    shared_ctx = tu_context();
    tu_close(tu_open(tu_handle(600, 1 << 20)));
    tu_close(tu_open(tu_handle(600, 1 << 20))); /* lent: the library's key is made */
    cr_assert_eq(pthread_key_create(&late_key, ipc_at_late_exit), 0);
    churn(CHURNED_LATE_EXIT);
    cr_assert_eq(atomic_load(&late_failures), 0, "an IPC call in the late destructor failed");
    long long locked = locked_hits_of_a_new_thread(stats);
    cr_assert_leq(locked, 2, "%lld of %d hits took the lock", locked, PAIRS);
}

static CUdeviceptr held_by_main;

/* Closes the reference the main thread holds on its loan. */
static void *close_mains_reference(void *arg)
{
    (void)arg;
    cuCtxSetCurrent(shared_ctx);
    return cuIpcCloseMemHandle(held_by_main) == CUDA_SUCCESS ? NULL : (void *)1;
}

/* A thread's loan taken back by another thread's close: the thread's next
 * hits of that handle, answered from its memo, lend it the entry again
 * (after the locked uses in a row that such a recall asks for). */
Test(threads, memo_hit_lends_again_after_a_recall, .timeout = 30)
{
    const char *stats = tu_stats_file();
    shared_ctx = tu_context();
    held_by_main = tu_open(tu_handle(600, 1 << 20)); /* lent to the main thread */
    tu_run_threads(close_mains_reference, 1);
    raise(SIGUSR1);
    long long before = tu_stat(stats, "hits_locked");
    cr_assert_eq(pairs_on_600(PAIRS), 0);
    raise(SIGUSR1);
    long long locked = tu_stat(stats, "hits_locked") - before;
    cr_assert_leq(locked, 3, "%lld of %d hits took the lock", locked, PAIRS);
    cr_assert_eq(tu_driver().maps, 1);
}

/* ---- an open that waits for another thread's close ----------------------- */

static CUcontext first_ctx;

/* In the first context: a new handle (allocation serial, 8 KiB) left idle
 * puts the idle mappings past a cap, and this thread's close evicts. */
static void *evict_in_first_ctx(void *serial)
{
    cuCtxSetCurrent(first_ctx);
    CUdeviceptr p = 0;
    if (cuIpcOpenMemHandle(&p, tu_handle((uintptr_t)serial, 8192), 1) != CUDA_SUCCESS)
        return (void *)1;
    return cuIpcCloseMemHandle(p) == CUDA_SUCCESS ? NULL : (void *)2;
}

/* Opens and closes serial in the first context (idle there), creates a
 * second context, current from now on, and starts a thread whose open and
 * close of serial + 1 in the first context evicts: its close is inside the
 * driver (slow: FAKECUDA_CLOSE_DELAY_US) when this returns. */
static pthread_t evicting_in_first_ctx(uint64_t serial, CUcontext *second, CUdeviceptr *idle)
{
    first_ctx = tu_context();
    *idle = tu_open(tu_handle(serial, 4096));
    tu_close(*idle);
    cr_assert_eq(cuCtxCreate_v2(second, 0, 0), CUDA_SUCCESS);
    setenv("FAKECUDA_CLOSE_DELAY_US", "400000", 1);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, evict_in_first_ctx, (void *)(uintptr_t)(serial + 1)), 0);
    while (tu_driver().close_calls < 1)
        usleep(100);
    return t;
}

static void joined(pthread_t t)
{
    void *ret;
    pthread_join(t, &ret);
    cr_assert_null(ret);
}

/* One process maps a handle in one context per device. The cache's idle
 * mapping in another context gives way to an open here; when another
 * thread is already closing it (the driver's unmap takes milliseconds),
 * the open waits for that close, as it would have found the mapping gone
 * without the cache. */
static void open_while_its_idle_mapping_closes_elsewhere(uint64_t serial)
{
    setenv("IPCCACHE_MAX_IDLE_BYTES", "4096", 1);
    CUcontext second = NULL;
    CUdeviceptr a, b = 0;
    /* past IPCCACHE_MAX_IDLE_BYTES both idle mappings go, in one batch: none
     * is left for another thread to take */
    pthread_t t = evicting_in_first_ctx(serial, &second, &a);
    cr_assert_eq(cuIpcOpenMemHandle(&b, tu_handle(serial, 4096), 1), CUDA_SUCCESS);
    joined(t);
    cr_assert_eq(fakecuda_refcount(first_ctx, a), 0, "closed in the first context");
    cr_assert_eq(fakecuda_refcount(second, b), 1);
}

Test(threads, open_waits_for_a_close_in_flight_elsewhere_on_device, .timeout = 30)
{
    open_while_its_idle_mapping_closes_elsewhere(500);
}

/* The same, when the open's give-way closes an idle mapping itself: it still
 * waits for the close another thread has in flight there, which is in the
 * way too (the same exporter's). */
Test(threads, open_that_closed_one_still_waits_for_a_close_in_flight, .timeout = 30)
{
    setenv("IPCCACHE_MAX_IDLE_ENTRIES", "1", 1);
    CUcontext second = NULL;
    CUdeviceptr older, b = 0;
    /* past IPCCACHE_MAX_IDLE_ENTRIES=1 the older goes (slowly), 521 stays idle */
    pthread_t t = evicting_in_first_ctx(520, &second, &older);
    unsetenv("FAKECUDA_CLOSE_DELAY_US"); /* read already: the give-way's own close is quick */
    cr_assert_eq(cuIpcOpenMemHandle(&b, tu_handle(521, 8192), 1), CUDA_SUCCESS);
    joined(t);
    cr_assert_eq(fakecuda_refcount(first_ctx, older), 0, "closed in the first context");
    cr_assert_eq(fakecuda_refcount(second, b), 1);
    cr_assert_eq(tu_driver().unmaps, 2);
}

/* The same, when that close ends after the driver refused the open (its
 * refusal may come late in a slow open) but before the open looks for what
 * was in its way: the mapping that made the driver refuse is gone, and
 * without the cache it was gone before the open; the open is tried again. */
Test(threads, open_refused_by_a_close_that_ended_meanwhile_is_retried, .timeout = 30)
{
    /* past the batch's two closes of 400 ms each */
    setenv("FAKECUDA_REFUSED_OPEN_DELAY_US", "1600000", 1);
    open_while_its_idle_mapping_closes_elsewhere(540);
}

/* ---- a close the driver alone would refuse ------------------------------- */

/* While the cache's own close of an idle mapping is inside the driver, the
 * program opens that handle there again: the driver hands back the mapping
 * still held for that close. The program's close past its own reference
 * must still be refused, as it is without the cache (the mapping was gone
 * before the open), not take the reference of the close in flight. */
Test(threads, extra_close_while_the_cache_closes_that_mapping_is_refused, .timeout = 30)
{
    setenv("IPCCACHE_MAX_IDLE_BYTES", "4096", 1);
    CUcontext second = NULL;
    CUdeviceptr a, again = 0;
    pthread_t t = evicting_in_first_ctx(560, &second, &a);
    unsetenv("FAKECUDA_CLOSE_DELAY_US"); /* read already: this thread's closes are quick */
    cr_assert_eq(cuCtxSetCurrent(first_ctx), CUDA_SUCCESS);
    cr_assert_eq(cuIpcOpenMemHandle(&again, tu_handle(560, 4096), 1), CUDA_SUCCESS);
    cr_assert_eq(again, a, "the mapping still held for the close in flight");
    cr_assert_eq(cuIpcCloseMemHandle(again), CUDA_SUCCESS);
    cr_assert_eq(cuIpcCloseMemHandle(again), CUDA_ERROR_INVALID_VALUE);
    joined(t);
    cr_assert_eq(fakecuda_refcount(first_ctx, a), 0, "closed once by each");
}
