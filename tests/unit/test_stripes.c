/*
 * test_stripes.c - the counters' stripes (shim/stats/stats.c) alone: which
 * stripe a thread counts on after a fork and after its own exit. A stripe
 * two threads write with plain stores loses counts; these tests check the
 * ownership that rules it out, without needing the two to collide, and that
 * the shared stripe's add is one indivisible step, by interrupting it.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stats.h"

static struct ipcc_counters *shared(void)
{
    return &ipcc_stripes[IPCC_SHARED_STRIPE].c;
}

static struct ipcc_counter_stripe *stripe_of(struct ipcc_counters *c)
{
    return (struct ipcc_counter_stripe *)c; /* c is its first member */
}

static void *count_once(void *arg)
{
    IPCC_COUNT(hits);
    *(struct ipcc_counters **)arg = ipcc_stripe_here;
    return NULL;
}

/* The fork child's reset (lifecycle.c runs ipcc_stats_reset there) frees the
 * stripes of the threads that did not come along, not the forking thread's:
 * it keeps counting on it, so the child's next thread must take another. */
Test(stripes, fork_child_keeps_the_forking_threads_stripe, .timeout = 10)
{
    IPCC_COUNT(hits);
    struct ipcc_counters *mine = ipcc_stripe_here;
    cr_assert_neq(mine, shared(), "the first thread owns a stripe");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        ipcc_stats_reset();
        struct ipcc_counters *theirs = NULL;
        pthread_t t;
        if (pthread_create(&t, NULL, count_once, &theirs) != 0 || pthread_join(t, NULL) != 0)
            _exit(2);
        IPCC_COUNT(hits);
        _exit(ipcc_stripe_here == mine && theirs != mine && theirs != shared() &&
                      IPCC_TOTAL(hits) == 2
                  ? 0
                  : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child's new thread shares the forking thread's stripe (status %#x)", status);
}

/* A thread-exit destructor that runs after the stripe went back counts on
 * the shared stripe (atomic adds), never on the one given back, which the
 * next thread may take. */
static pthread_key_t late_key;
static struct ipcc_counter_stripe *own_stripe;
static struct ipcc_counters *late_stripe;

static void late_count(void *arg)
{
    if (atomic_load(&own_stripe->taken)) { /* the stripe's destructor has not run yet */
        pthread_setspecific(late_key, arg);
        return;
    }
    late_stripe = ipcc_stripe_here;
    IPCC_COUNT(misses);
}

static void *count_then_exit(void *arg)
{
    (void)arg;
    IPCC_COUNT(hits);
    own_stripe = stripe_of(ipcc_stripe_here);
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

Test(stripes, counts_after_the_stripe_went_back_go_to_the_shared_one, .timeout = 10)
{
    cr_assert_eq(pthread_key_create(&late_key, late_count), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, count_then_exit, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_neq(&own_stripe->c, shared(), "the thread owned a stripe");
    cr_assert_eq(atomic_load(&own_stripe->taken), 0, "given back at the thread's exit");
    cr_assert_eq(late_stripe, shared(), "a later destructor counts on the stripe given back");
    cr_assert_eq(IPCC_TOTAL(misses), 1);
    cr_assert_eq(IPCC_TOTAL(hits), 1);
}

/* The shared stripe's add cannot be split: a signal handler that counts
 * on it, interrupting the same thread's adds, loses none of either. With a
 * plain load and store, a handler that runs between the two has its count
 * overwritten. Signals land at whatever instruction the thread is at (a
 * preemption or an interrupt), so the two collide on one CPU as on many,
 * loaded or not (with plain adds, two cores under four busy loops: 2,999 of
 * 3,001 handler counts lost, six runs of six failing). */
#define INTERRUPTIONS 3000

static _Atomic int interrupted;
static _Atomic int interrupting_done;
static pthread_t counting_thread;

static void count_in_handler(int sig)
{
    (void)sig;
    IPCC_COUNT(hits);
    atomic_fetch_add(&interrupted, 1);
}

static void *interrupt(void *arg)
{
    (void)arg;
    while (atomic_load(&interrupted) < INTERRUPTIONS) {
        pthread_kill(counting_thread, SIGUSR2);
        sched_yield();
    }
    atomic_store(&interrupting_done, 1);
    return NULL;
}

Test(stripes, shared_stripe_add_is_indivisible, .timeout = 60)
{
    struct sigaction sa = { .sa_handler = count_in_handler };
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR2, &sa, NULL), 0);
    ipcc_stripe_here = shared(); /* as a thread past the owned stripes */
    counting_thread = pthread_self();
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, interrupt, NULL), 0);
    uint64_t mine = 0;
    while (!atomic_load_explicit(&interrupting_done, memory_order_relaxed)) {
        IPCC_COUNT(hits);
        mine++;
    }
    cr_assert_eq(pthread_join(t, NULL), 0);
    sigset_t usr2;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &usr2, NULL); /* a last one still pending stays so */
    uint64_t handled = (uint64_t)atomic_load(&interrupted);
    cr_assert_eq(IPCC_TOTAL(hits), mine + handled, "%llu counts lost of %llu interruptions",
                 (unsigned long long)(mine + handled - IPCC_TOTAL(hits)),
                 (unsigned long long)handled);
}
