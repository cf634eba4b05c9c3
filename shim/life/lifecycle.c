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
#include "stats.h"

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
 *    takes both, so the fork waits; the child resets them. A fork from a
 *    handler on a thread inside the table lock: before_fork. The guard covers
 *    the two calls whose glibc lock fork neither takes nor resets: atexit()
 *    (exit handlers) and dl_iterate_phdr() (the loader's object list).
 *  - in dlopen/dladdr/dlsym/dlclose (entry/resolve.c, base/driver.c): the loader's lock, which
 *    glibc's fork resets in the child; so is its TLS lock.
 *  - in the tables' memory (mem.c): its lock is taken last, reset too.
 *  - in the program's allocator: never under a lock of ours, whose holder
 *    would wait for an allocator lock that a fork handler registered after
 *    ours took (POSIX runs it first). The tables' memory is ours (mem.c);
 *    glibc's atexit() allocates inside the guard, which is why the handler
 *    registered at start (below) empties the guard before any allocator's
 *    of the program's start-up takes its lock. glibc's malloc takes its locks after every
 *    handler and resets them.
 *  - in pthread_once (start, the driver's functions): an init under way in
 *    the parent runs again in the child; start() is safe to run twice.
 *  - in pthread_create (the helper thread): the stack list is reset.
 *  - in pthread_atfork (this file's second registration, at start; no other
 *    module registers one): fork holds that list's lock throughout and
 *    releases it in both processes.
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
 * Registered when the library is loaded, not at start: glibc runs for a fork
 * only the handlers registered before that fork began, so a fork begun just
 * before start would otherwise copy the lock while another thread's fork
 * holds it, into a child that never resets it. Before start they take locks
 * nobody else takes and clear empty tables: nothing a program can notice.
 * The tables' memory (mem.c) is taken last: its holders hold nothing else.
 */
/*
 * A fork from a signal handler that interrupted its own thread inside the
 * table lock (the lock is not recursive) takes it not again, which would
 * wait forever: it goes on as without the library. The tables are then
 * half-updated, and the interrupted call carries on in both processes once
 * the handler returns, still holding the lock: the parent's is as it was;
 * the child keeps the lock for that call to let go, resets nothing (a reset
 * would walk the half-updated tables) and is the library off from then on:
 * every call passes through, its exit releases nothing. Its kept VMM dups
 * stay open until it execs (close-on-exec) or exits. The fork guard and the
 * tables' memory are never held by a thread a signal interrupts (both hold
 * signals off).
 */
static __thread int fork_inside __attribute__((tls_model("initial-exec")));

static void before_fork(void)
{
    fork_inside = ipcc_lock_held_here();
    if (!fork_inside)
        ipcc_lock();
    ipcc_fork_guard_hold();
    ipcc_mem_hold();
}

static void after_fork_parent(void)
{
    ipcc_mem_release();
    ipcc_fork_guard_release();
    if (!fork_inside)
        ipcc_unlock();
}

/*
 * Registered at start, before any exit handler's registration (ours, the
 * stats marker's, the release helper's): after the allocators of the
 * program's start-up, so POSIX runs its prepare step before theirs. glibc's
 * atexit() allocates inside the fork guard; this step lets that thread out
 * while the allocator's lock is still free, and closes the guard to others
 * (lock.c), before the allocator's prepare step takes its lock.
 */
static void before_fork_late(void)
{
    ipcc_fork_guard_close();
}

static void after_fork_late(void)
{
    ipcc_fork_guard_open();
}

/* The child's mappings belong to the parent's contexts: forget them all.
 * The locks may have been taken by a thread that does not exist here. The
 * library's one child handler: every layer's reset runs from it, in the
 * order of entry/wiring.c's list. */
static void after_fork_child(void)
{
    ipcc_mem_reset();
    ipcc_fork_guard_reset();
    if (fork_inside) {
        ipcc_config.disabled = 1; /* as without the library: see before_fork */
        return;
    }
    ipcc_lock_reset();
    for (size_t i = 0; layers && i < layers->fork_children; i++)
        layers->fork_child[i]();
}

__attribute__((constructor)) static void watch_forks(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* Once: a child may run start again (registered twice would be harmless). */
static void watch_forks_late(void)
{
    static _Atomic int registered;
    if (!atomic_exchange(&registered, 1))
        pthread_atfork(before_fork_late, after_fork_late, NULL); /* the child resets all */
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
    if (ran++ || ipcc_config.disabled) /* a child forked inside the lock */
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
    char signal[32];
    ipcc_signal_name(ipcc_config.stats_signal, signal, sizeof(signal));
    ipcc_log(IPCC_LOG_INFO,
             "version %s active: max_idle_bytes=%llu max_idle_entries=%llu "
             "stats_signal=%s stats_file=%s stats_at_exit=%d",
             IPCC_VERSION, (unsigned long long)ipcc_config.max_idle_bytes,
             (unsigned long long)ipcc_config.max_idle_entries, signal,
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
