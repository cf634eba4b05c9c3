/*
 * lock.c - the table lock, the library's only lock of its own data (the
 * tables' memory has its own, innermost: mem.c), and
 * the fork guard (below), which keeps forks out of a few C library calls.
 *
 * glibc's adaptive mutex: a waiter spins briefly before sleeping (critical
 * sections are a hash lookup and a reference count), and a running thread
 * may take the lock again before a sleeper wakes, which keeps the lock's
 * cache line where the work is when several threads hit at once. Measured
 * on one H200 host against a hand-written three-state futex lock, it gave
 * the same single-thread hit (about 100 ns per open+close) and 1.5x the
 * throughput with 8 threads on one handle; against a test-and-set spinlock,
 * 3x (results/2026-11-29-h200-quick/locks.txt).
 *
 * Never held across a driver call; never taken in a signal handler. Exit may
 * run inside one (a handler that calls exit()), so the exit path only tries.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>

#include "lock.h"

/* How often the exit path tries before it gives up on a lock another thread
 * holds; critical sections are a hash lookup, so a few yields suffice. */
#define EXIT_TRIES 100

static pthread_mutex_t table_lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;

/* Whether this thread holds the lock: exit() from a signal handler may run
 * on a thread interrupted inside a critical section. */
static __thread int held_here __attribute__((tls_model("initial-exec")));

void ipcc_lock(void)
{
    pthread_mutex_lock(&table_lock);
    held_here = 1;
}

void ipcc_unlock(void)
{
    held_here = 0;
    pthread_mutex_unlock(&table_lock);
}

/* Whether this thread holds the lock: a fork from a signal handler that
 * interrupted it inside (lifecycle.c). Marked just after the mutex is
 * taken and unmarked just before it is let go: a signal in those two
 * instructions finds it unmarked (and its fork waits, as it did always). */
int ipcc_lock_held_here(void)
{
    return held_here;
}

/* Takes the lock without waiting on it: 0 if this thread may hold it
 * already, or another thread kept it through every try. For exit, which
 * must never block. */
int ipcc_lock_try(void)
{
    if (held_here)
        return 0;
    for (int i = 0; i < EXIT_TRIES; i++) {
        /* Busy too when this thread was interrupted between taking the
         * mutex and marking it: the tries then run out. */
        if (pthread_mutex_trylock(&table_lock) == 0) {
            held_here = 1;
            return 1;
        }
        sched_yield();
    }
    return 0;
}

/* Fork child: the holder, if any, was another thread and is gone (the
 * forking thread took the lock in the prepare handler). */
void ipcc_lock_reset(void)
{
    static const pthread_mutex_t fresh = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;
    table_lock = fresh;
    held_here = 0;
}

/* ---- the fork guard ----------------------------------------------------- */

/*
 * A few C library calls hold a lock of glibc's that its fork neither takes
 * nor resets in the child: atexit() (the list of exit handlers) and
 * dl_iterate_phdr() (the loader's list of objects). A fork in one of them on
 * another thread gives a child that waits on that lock forever, at exit or
 * at its own call. The library makes them only inside this guard, which its
 * fork handler takes after the table lock: a fork waits the instant such a
 * call takes. Signals wait too: a handler on this thread that forks, or
 * calls exit(), would wait on what this thread holds.
 */
static pthread_mutex_t fork_guard = PTHREAD_MUTEX_INITIALIZER;
/* Forks whose first prepare step closed the guard to new entrants (below). */
static _Atomic int forks_closing;

void ipcc_fork_guard_enter(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, saved);
    for (;;) {
        pthread_mutex_lock(&fork_guard);
        if (!atomic_load(&forks_closing))
            return;
        pthread_mutex_unlock(&fork_guard); /* after the fork */
        sched_yield();
    }
}

void ipcc_fork_guard_leave(const sigset_t *saved)
{
    pthread_mutex_unlock(&fork_guard);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

/* For the fork handlers: held from the prepare step to the parent's or the
 * child's step. The child resets it, as the table lock. */
void ipcc_fork_guard_hold(void)
{
    pthread_mutex_lock(&fork_guard);
}

void ipcc_fork_guard_release(void)
{
    pthread_mutex_unlock(&fork_guard);
}

void ipcc_fork_guard_reset(void)
{
    static const pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    fork_guard = fresh;
    atomic_store(&forks_closing, 0);
}

/*
 * For the fork handler registered at start, whose prepare step runs before
 * those of the allocators of the program's start-up: waits until the thread
 * inside the guard, if any, is out (glibc's atexit() allocates in there, and
 * its allocator's lock is still free), and lets nobody new in until the
 * fork's parent or child step. It holds no lock across the other handlers:
 * a fork begun before this handler was registered takes theirs before ours.
 */
void ipcc_fork_guard_close(void)
{
    atomic_fetch_add(&forks_closing, 1);
    pthread_mutex_lock(&fork_guard);
    pthread_mutex_unlock(&fork_guard);
}

void ipcc_fork_guard_open(void)
{
    atomic_fetch_sub(&forks_closing, 1);
}
