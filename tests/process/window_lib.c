/*
 * window_lib.c - preloaded ahead of ipccache by tests/process/probe.c's "window"
 * scenarios: it widens, on request, a short moment in which ipccache sits
 * inside a C library call, so that a test can fork or signal in it for sure
 * instead of once in thousands of runs. IPCC_TEST_WINDOW picks the call:
 *
 *   atexit     the registration of an exit handler that must allocate a new
 *              block of glibc's list (window_fill_exit_block makes the next
 *              one do so): the allocation sleeps while glibc holds its lock
 *              of the exit handlers, which a fork does not reset
 *   phdr       dl_iterate_phdr: its first callback sleeps while the loader
 *              holds the lock of the object list, which a fork does not reset
 *   sigaction  a handler of ipccache's being installed: the signal is raised
 *              after the kernel put it in place and before the old action is
 *              handed back, as another thread's signal could arrive
 *   lock       ipccache's first reading of the precise clock (CLOCK_MONOTONIC)
 *              once armed: a close reads it under the table lock (run with
 *              IPCC_TEST_WINDOW_RAISE, the signal comes while that thread
 *              holds the lock)
 *
 * Only calls made while armed (window_arm) and, for sigaction, only
 * ipccache's own, are widened. window_wait_open waits until one is.
 * IPCC_TEST_WINDOW_RAISE=SIGNO: an atexit, phdr or lock window raises that signal
 * on its own thread instead of sleeping, as a signal could arrive there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

#include "exit_registration.h"
#define WIDE_NS 300000000L /* the window: long next to a fork, short next to a test */

EXPORT void window_arm(void);
EXPORT int window_wait_open(void);
EXPORT int window_fill_exit_block(void);
EXPORT int window_raised(void);

extern void *__libc_calloc(size_t, size_t); /* dlsym itself may call calloc */

static atomic_int armed, opened, raised;
/* volatile: the compiler takes calloc for the builtin, which changes nothing else */
static __thread volatile long callocs_in_registration;

static int mode_is(const char *name)
{
    const char *m = getenv("IPCC_TEST_WINDOW");
    return m && strcmp(m, name) == 0;
}

static void sleep_ns(long ns)
{
    struct timespec t = { ns / 1000000000L, ns % 1000000000L };
    while (nanosleep(&t, &t) != 0)
        ;
}

/* The one widened call: marks the window open, then holds it (or raises
 * the signal asked for in it). */
static void widen(void)
{
    if (!atomic_exchange(&armed, 0))
        return;
    atomic_store(&opened, 1);
    const char *raise_sig = getenv("IPCC_TEST_WINDOW_RAISE");
    if (raise_sig)
        raise(atoi(raise_sig));
    else
        sleep_ns(WIDE_NS);
}

void window_arm(void)
{
    atomic_store(&armed, 1);
}

/* 1 once a widened call is under way; 0 after 3 s without one. */
int window_wait_open(void)
{
    for (int i = 0; i < 3000 && !atomic_load(&opened); i++)
        sleep_ns(1000000);
    return atomic_load(&opened);
}

/* ---- atexit ------------------------------------------------------------- */

EXPORT void *calloc(size_t n, size_t size)
{
    if (in_registration) {
        callocs_in_registration++;
        if (mode_is("atexit"))
            widen();
    }
    return __libc_calloc(n, size);
}

static long callocs_so_far(void)
{
    return callocs_in_registration;
}

int window_fill_exit_block(void)
{
    return fill_exit_block(callocs_so_far);
}

/* ---- dl_iterate_phdr ---------------------------------------------------- */

struct wrapped {
    int (*callback)(struct dl_phdr_info *, size_t, void *);
    void *arg;
};

static int slow_callback(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct wrapped *w = arg;
    widen();
    return w->callback(info, size, w->arg);
}

EXPORT int dl_iterate_phdr(int (*callback)(struct dl_phdr_info *, size_t, void *), void *arg)
{
    static int (*real)(int (*)(struct dl_phdr_info *, size_t, void *), void *);
    if (!real)
        real = (int (*)(int (*)(struct dl_phdr_info *, size_t, void *), void *))dlsym(
            RTLD_NEXT, "dl_iterate_phdr");
    if (!mode_is("phdr") || !atomic_load(&armed))
        return real(callback, arg);
    struct wrapped w = { callback, arg };
    return real(slow_callback, &w);
}

static int is_ipccache(const void *fn)
{
    Dl_info info;
    return fn && dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libipccache");
}

/* ---- the table lock ------------------------------------------------------ */

EXPORT int clock_gettime(clockid_t clk, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(clk, ts);
    if (clk == CLOCK_MONOTONIC && mode_is("lock") && atomic_load(&armed) &&
        is_ipccache(__builtin_return_address(0)))
        widen();
    return rc;
}

/* ---- sigaction ---------------------------------------------------------- */

int window_raised(void)
{
    return atomic_load(&raised);
}

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    static int (*real)(int, const struct sigaction *, struct sigaction *);
    if (!real)
        real = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT,
                                                                               "sigaction");
    if (!mode_is("sigaction") || !act || !old || !is_ipccache((const void *)act->sa_sigaction))
        return real(sig, act, old);
    struct sigaction was;
    int rc = real(sig, act, &was);
    if (rc == 0 && atomic_load(&armed)) {
        atomic_store(&armed, 0);
        raise(sig); /* handled before raise returns */
        atomic_fetch_add(&raised, 1);
    }
    *old = was;
    return rc;
}
