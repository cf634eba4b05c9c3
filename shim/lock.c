/*
 * lock.c - the table lock: the library's only lock.
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
 * Never held across a driver call; never taken in a signal handler.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "internal.h"

static pthread_mutex_t table_lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;

void ipcc_lock(void)
{
    pthread_mutex_lock(&table_lock);
}

void ipcc_unlock(void)
{
    pthread_mutex_unlock(&table_lock);
}

/* Fork child: the holder, if any, was another thread and is gone (the
 * forking thread took the lock in the prepare handler). */
void ipcc_lock_reset(void)
{
    static const pthread_mutex_t fresh = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;
    table_lock = fresh;
}
