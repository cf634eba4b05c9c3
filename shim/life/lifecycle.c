/*
 * lifecycle.c - start-up on the first IPC call, fork, and exit. Below the
 * layers it starts and resets: they register what to run with
 * ipcc_life_register() (entry/wiring.c, at load), so that this file calls
 * nothing above the basics and the stats.
 *
 * At load time only the fork handlers are registered (see there): a process
 * that never opens an IPC handle gets no signal handler, no atexit entry,
 * no thread and no message from us. The first intercepted call reads the
 * settings and sets everything up, once.
 *
 * The table lock (lock.c) is the library's only lock of its data (with the
 * tables' memory's, mem.c, innermost); the fork handlers below take them and
 * reset them in the child (musl's fork does the same).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "life.h"

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static const struct ipcc_life_hooks *layers;

/* Before any fork or IPC call can reach the handlers below. */
void ipcc_life_register(const struct ipcc_life_hooks *h)
{
    layers = h;
}

/* ---- fork: no CUDA calls here; the child's CUDA state is not usable ----- */

/*
 * Where another thread may be when a thread forks, and why the child lives:
 *  - in the table lock or the fork guard (lock.c): the prepare handler below
 *    takes both, so the fork waits; the child resets them. The guard covers
 *    the two calls whose glibc lock fork neither takes nor resets: atexit()
 *    (exit handlers) and dl_iterate_phdr() (the loader's object list).
 *  - in dlopen/dladdr/dlsym/dlclose (entry/resolve.c, base/driver.c): the loader's lock, which
 *    glibc's fork resets in the child; so is its TLS lock.
 *  - in the tables' memory (mem.c): its lock is taken last, reset too.
 *  - in the program's allocator: never under a lock of ours, whose holder
 *    would wait for an allocator lock that a fork handler registered after
 *    ours took (POSIX runs it first). The tables' memory is ours (mem.c);
 *    glibc's atexit() allocates inside the guard, which is why the handler
 *    registered at start (below) takes our locks before any allocator's of
 *    the program's start-up. glibc's malloc takes its locks after every
 *    handler and resets them.
 *  - in pthread_once (start, the driver's functions): an init under way in
 *    the parent runs again in the child; start() is safe to run twice.
 *  - in pthread_create (the helper thread): the stack list is reset.
 *  - in pthread_atfork (modules register their child handlers lazily): fork
 *    holds that list's lock throughout and releases it in both processes.
 *  - in strerror (a read lock of the message catalogs, shared: the child's
 *    readers pass), vsnprintf and write (no lock) for a message.
 *  - in a driver call (the helper's close, release or unmap; never under a
 *    lock of ours): the child's CUDA is unusable anyway, and no handler
 *    here calls the driver; the child's tables are empty, so its exit
 *    releases nothing.
 *  - in the stats signal handler: write() only.
 * The library takes no stdio, environment-writing or locale lock.
 */

/*
 * What a fork holds of ours, from the prepare step to the parent's or the
 * child's: the table lock, the fork guard and the tables' memory (mem.c),
 * in that order (the last two are taken inside the first's holders' code).
 */
static void hold_all(void)
{
    ipcc_lock();
    ipcc_fork_guard_hold();
    ipcc_mem_hold();
}

static void release_all(void)
{
    ipcc_mem_release();
    ipcc_fork_guard_release();
    ipcc_unlock();
}

/*
 * Two registrations take them: one when the library is loaded, and one at
 * start (below), after any allocator's of the program's start-up. POSIX
 * runs the later prepare first, so the one of start takes our locks before
 * such an allocator's prepare takes the allocator's: a thread inside the
 * fork guard while glibc's atexit() allocates (which we cannot move out of
 * it) then gets its memory and lets go. Whichever prepare runs first takes
 * them, and only its parent step lets go: the forking thread's own record.
 */
enum { HELD_NONE, HELD_BY_LOAD, HELD_BY_START };
static __thread int fork_held_by __attribute__((tls_model("initial-exec")));

static void hold_for(int who)
{
    if (fork_held_by != HELD_NONE)
        return;
    hold_all();
    fork_held_by = who;
}

static void release_for(int who)
{
    if (fork_held_by != who)
        return;
    fork_held_by = HELD_NONE;
    release_all();
}

/*
 * The load-time one, not only at start: glibc runs for a fork only the
 * handlers registered before that fork began, so a fork begun just before
 * start would otherwise copy the lock while another thread's fork holds it,
 * into a child that never resets it. Before start they take locks nobody
 * else takes and clear empty tables: nothing a program can notice.
 */
static void before_fork(void)
{
    hold_for(HELD_BY_LOAD);
}

static void after_fork_parent(void)
{
    release_for(HELD_BY_LOAD);
}

static void before_fork_late(void)
{
    hold_for(HELD_BY_START);
}

static void after_fork_parent_late(void)
{
    release_for(HELD_BY_START);
}

/* The child's mappings belong to the parent's contexts: forget them all.
 * The locks may have been taken by a thread that does not exist here. This
 * one runs first of ours in the child (POSIX: in registration order). */
static void after_fork_child(void)
{
    fork_held_by = HELD_NONE;
    ipcc_mem_reset();
    ipcc_fork_guard_reset();
    ipcc_lock_reset();
    for (size_t i = 0; layers && i < IPCC_LIFE_RESETS && layers->fork_child[i]; i++)
        layers->fork_child[i]();
    ipcc_stats_reset();
}

__attribute__((constructor)) static void watch_forks(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* At start, before the exit handlers' registrations (which the guard covers:
 * ours, the stats marker's, the release helper's). Once: a child may run
 * start again (registered twice would be harmless). */
static void watch_forks_late(void)
{
    static _Atomic int registered;
    if (!atomic_exchange(&registered, 1))
        pthread_atfork(before_fork_late, after_fork_parent_late, NULL);
}

/* ---- exit --------------------------------------------------------------- */

/* Registered at the first IPC call, hence after cudart's own exit handler,
 * hence run before it tears the driver down. If the driver is gone anyway,
 * the closes fail quietly; it cannot be unmapped (driver.c pins it).
 *
 * exit() may come from a signal handler that interrupted this thread inside
 * the table lock, the table half-updated: then the release is skipped, as
 * when another thread keeps the lock. The driver unmaps everything when the
 * process ends anyway; the release only hands memory back sooner. */
static void at_exit(void)
{
    static int ran; /* registered twice after a fork during start() */
    if (ran++)
        return;
    if (ipcc_config.stats_at_exit)
        ipcc_stats_write_line();
    if (!ipcc_lock_try())
        return;
    ipcc_unlock(); /* free now: the release takes it a batch at a time */
    if (layers && layers->release_idle)
        layers->release_idle(); /* both kinds */
}

/* ---- start -------------------------------------------------------------- */

static void log_start(void)
{
    ipcc_log(IPCC_LOG_INFO,
             "version %s active: max_idle_bytes=%llu max_idle_entries=%llu "
             "stats_signal=%d stats_file=%s stats_at_exit=%d",
             IPCC_VERSION, (unsigned long long)ipcc_config.max_idle_bytes,
             (unsigned long long)ipcc_config.max_idle_entries, ipcc_config.stats_signal,
             ipcc_config.stats_file[0] ? ipcc_config.stats_file : "(stderr)",
             ipcc_config.stats_at_exit);
}

static void start(void)
{
    ipcc_config_load();
    if (ipcc_config.disabled) {
        ipcc_config_say_disabled();
        return;
    }
    watch_forks_late(); /* before any exit handler's registration */
    if (layers && layers->start && layers->start() < 0) {
        ipcc_log(IPCC_LOG_WARN, "out of memory at start; passing calls through");
        ipcc_config.disabled = 1;
        return;
    }
    ipcc_stats_install_handler();
    ipcc_atexit(at_exit);
    log_start();
}

_Atomic int ipcc_life_started;

/* The first intercepted call (life.h's ipcc_lifecycle_start). */
void ipcc_lifecycle_start_now(void)
{
    pthread_once(&start_once, start);
    atomic_store_explicit(&ipcc_life_started, 1, memory_order_release);
}
