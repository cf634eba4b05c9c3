/*
 * helper_hold_lib.c - preloaded ahead of ipccache by tests/process/test_ghost.c's
 * late-helper tests: the thread ipccache creates (its release helper) exists
 * but does not run ipccache's code until helper_hold_release(), as a thread
 * the scheduler has not run yet on a throttled host.
 *
 * While it is held, the thread that created it must not wait for it: every
 * call of that thread that could sleep (a futex wait through syscall(), a
 * sleep, a yield) is counted, and a futex wait returns at
 * once (ETIMEDOUT) so that a bounded wait fails fast instead of taking its
 * time. helper_hold_waits() reads the count: -1 while no thread is held.
 * (Condition waits are not counted: ipccache has none, and forwarding them
 * would need glibc's two versions told apart.)
 *
 * HELPER_HOLD_CREATE_MS=N: creating that thread takes N ms besides, as on a
 * host short of memory or CPU, so that other threads' calls meet its creator
 * midway.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int helper_hold_waits(void);
EXPORT void helper_hold_release(void);

static atomic_int held;       /* a thread of ipccache's is held */
static atomic_int waits;      /* sleeping calls of its creator meanwhile */
static atomic_int creator;    /* that creator's tid */
static int gate[2] = { -1, -1 }; /* the held thread reads one byte from it */

static long real_syscall(long n, long a, long b, long c, long d, long e, long f)
{
    static long (*real)(long, ...);
    if (!real)
        real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(n, a, b, c, d, e, f);
}

static int gettid_now(void)
{
    return (int)real_syscall(SYS_gettid, 0, 0, 0, 0, 0, 0);
}

/* Whether the calling thread is the creator of a thread still held. */
static int creator_waits(void)
{
    if (!atomic_load(&held) || gettid_now() != atomic_load(&creator))
        return 0;
    atomic_fetch_add(&waits, 1);
    return 1;
}

int helper_hold_waits(void)
{
    return atomic_load(&held) ? atomic_load(&waits) : -1;
}

void helper_hold_release(void)
{
    if (atomic_exchange(&held, 0))
        (void)!write(gate[1], "g", 1);
}

/* ---- the held thread ------------------------------------------------------ */

struct start {
    void *(*fn)(void *);
    void *arg;
};

/* Raw read: under ASan this thread runs before the runtime knows it. */
static void *held_start(void *p)
{
    struct start s = *(struct start *)p;
    char c;
    while (real_syscall(SYS_read, gate[0], (long)&c, 1, 0, 0, 0) < 0 && errno == EINTR)
        ;
    return s.fn(s.arg);
}

/* Whether ipccache calls, directly or through another interposer of
 * pthread_create (ASan's, loaded first, hands us its own start routine). */
static int called_by_ipccache(void)
{
    void *frames[8];
    int n = backtrace(frames, 8);
    for (int i = 1; i < n; i++) {
        Dl_info info;
        if (dladdr(frames[i], &info) && info.dli_fname && strstr(info.dli_fname, "libipccache"))
            return 1;
    }
    return 0;
}

/* Only the first thread ipccache creates is held; one start record serves. */
EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    static struct start start;
    static atomic_int used;
    if (!real)
        real = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))dlsym(
            RTLD_NEXT, "pthread_create");
    if (atomic_load(&used) || !called_by_ipccache() || atomic_exchange(&used, 1) ||
        pipe2(gate, O_CLOEXEC) != 0)
        return real(t, attr, fn, arg);
    start = (struct start){ fn, arg };
    const char *slow = getenv("HELPER_HOLD_CREATE_MS");
    if (slow) {
        long ms = atol(slow);
        struct timespec pause = { ms / 1000, ms % 1000 * 1000000L };
        nanosleep(&pause, NULL);
    }
    atomic_store(&creator, gettid_now());
    atomic_store(&held, 1);
    int rc = real(t, attr, held_start, &start);
    if (rc != 0)
        atomic_store(&held, 0);
    return rc;
}

/* ---- the creator's sleeping calls ------------------------------------------ */

EXPORT long syscall(long n, ...)
{
    va_list ap;
    va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    int op = (int)b & FUTEX_CMD_MASK;
    if (n == SYS_futex && (op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET) && creator_waits()) {
        errno = ETIMEDOUT;
        return -1;
    }
    return real_syscall(n, a, b, c, d, e, f);
}

#define COUNTED(ret, name, params, args)                                                      \
    EXPORT ret name params                                                                    \
    {                                                                                         \
        static ret(*real) params;                                                             \
        if (!real)                                                                            \
            real = (ret(*) params)dlsym(RTLD_NEXT, #name);                                    \
        creator_waits();                                                                      \
        return real args;                                                                     \
    }

COUNTED(int, nanosleep, (const struct timespec *req, struct timespec *rem), (req, rem))
COUNTED(int, clock_nanosleep, (clockid_t id, int flags, const struct timespec *req,
                               struct timespec *rem), (id, flags, req, rem))
COUNTED(int, usleep, (useconds_t us), (us))
COUNTED(int, sched_yield, (void), ())
