/*
 * lock.c - the table lock: the library's only lock.
 *
 * A three-state futex mutex (0 free, 1 held, 2 held with sleepers). Taking
 * and releasing it costs one atomic instruction each when nobody waits,
 * which matters on a hit path of about a hundred nanoseconds. A waiter spins
 * briefly first (critical sections are a hash lookup and a reference
 * count), then sleeps. Like glibc's adaptive mutex it lets a running thread
 * take the lock again before a sleeper wakes, which keeps the lock's cache
 * line where the work is when several threads hit at once.
 *
 * Never held across a driver call; never taken in a signal handler.
 */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define SPINS 100

static _Atomic int lock_word;

static void futex_wait(int expected)
{
    syscall(SYS_futex, &lock_word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_one(void)
{
    syscall(SYS_futex, &lock_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

static int try_take(void)
{
    int free_word = 0;
    return atomic_compare_exchange_strong_explicit(&lock_word, &free_word, 1,
                                                   memory_order_acquire, memory_order_relaxed);
}

static void lock_contended(void)
{
    for (int i = 0; i < SPINS; i++) {
        cpu_relax();
        if (atomic_load_explicit(&lock_word, memory_order_relaxed) == 0 && try_take())
            return;
    }
    /* Mark "sleepers" so the holder's unlock wakes one of us. */
    while (atomic_exchange_explicit(&lock_word, 2, memory_order_acquire) != 0)
        futex_wait(2);
}

void ipcc_lock(void)
{
    if (__builtin_expect(!try_take(), 0))
        lock_contended();
}

void ipcc_unlock(void)
{
    if (atomic_exchange_explicit(&lock_word, 0, memory_order_release) == 2)
        futex_wake_one();
}

/* Fork child: the holder, if any, was another thread and is gone. */
void ipcc_lock_reset(void)
{
    atomic_store_explicit(&lock_word, 0, memory_order_relaxed);
}
