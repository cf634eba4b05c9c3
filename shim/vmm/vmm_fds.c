/*
 * vmm_fds.c - the fds the VMM path keeps: one dup per cached import of a
 * POSIX fd, its identity (vmm_identity.c). Without the cache a consumer
 * needs none of them (PyTorch closes each fd right after its import), so
 * they are bounded and kept out of the program's way:
 *   - how many: at most an eighth of the soft limit of open files
 *     (RLIMIT_NOFILE), read at each miss, since programs raise it at start
 *     (vLLM and SGLang do) and may lower it later. The program keeps seven
 *     eighths of its limit whatever it imports; at the bound the least
 *     recently used idle VMM things give theirs up first (the budget's
 *     eviction), and past that an import is passed through uncached, as
 *     without the cache (said once). A limit lowered under what is kept
 *     sheds the idle ones at the next miss, live ones at a miss after their
 *     release.
 *   - where: from half the limit up (at most 1024): away from the low
 *     numbers programs use (select() takes fds below 1024) and from the
 *     lowest free one the kernel hands out next, so a stray close of a
 *     number the program does not own seldom frees one of ours.
 *   - whose: each is marked (base/fdmark.c) and closed, or compared on a
 *     hit (vmm_identity.c), only while its number still names what was
 *     kept: a program that closed it and opened a file of its own there
 *     keeps that file. One that cannot be marked is not kept.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/resource.h>
#include <unistd.h>

#include "vmm_impl.h"
#include "budget.h"

#define SHARE_OF_LIMIT 8 /* kept dups: at most 1/8 of the soft limit */
#define FLOOR_MAX 1024

static _Atomic int said_full;

static rlim_t soft_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0)
        return 1024; /* cannot be; the common default */
    return r.rlim_cur;
}

/* How many dups may be kept now. */
static size_t bound_of(rlim_t soft)
{
    if (soft == RLIM_INFINITY || soft / SHARE_OF_LIMIT > (rlim_t)INT32_MAX)
        return INT32_MAX;
    return (size_t)(soft / SHARE_OF_LIMIT);
}

static void say_full(size_t bound, rlim_t soft)
{
    if (!atomic_exchange(&said_full, 1))
        ipcc_log(IPCC_LOG_INFO, "%zu VMM imports cached at once, an eighth of the soft limit of "
                                "%llu open files (one fd each): more are not cached; a higher "
                                "limit (ulimit -n) caches more", bound, (unsigned long long)soft);
}

/* A place for one more kept dup: 1, or 0 when the bound is reached and no
 * idle import gives one up (the import then goes uncached). Lock not held. */
static int claim(struct ipcc_vmm_table *t, rlim_t soft)
{
    size_t bound = bound_of(soft);
    for (int tries = 0; tries < 2; tries++) {
        ipcc_lock();
        int ok = ipcc_vmm_fd_claim(t, bound);
        ipcc_unlock();
        if (ok)
            return 1;
        if (tries == 0 && bound > 0)
            ipcc_budget_evict_fds_over(bound - 1); /* idle ones first, oldest first */
    }
    say_full(bound, soft);
    return 0;
}

static int floor_of(rlim_t soft)
{
    return soft >= 2 * FLOOR_MAX ? FLOOR_MAX : (int)(soft / 2);
}

/* A dup kept high, close-on-exec; anywhere when nothing is free up there
 * (a limit lowered since). */
static int high_dup(int fd, int floor)
{
    int d = fcntl(fd, F_DUPFD_CLOEXEC, floor);
    return d >= 0 || floor == 0 ? d : fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

static void say_unmarked(void)
{
    static _Atomic int said;
    if (!atomic_exchange(&said, 1))
        ipcc_log(IPCC_LOG_INFO, "a VMM export's fd cannot be polled, so a dup of it could not be "
                                "told from a file of the program's later: not cached");
}

/* A dup of fd, kept high and marked as ours; -1 when there is none. */
static int marked_dup(int fd, rlim_t soft)
{
    int d = high_dup(fd, floor_of(soft));
    if (d < 0 || ipcc_fd_mark(d, floor_of(soft)))
        return d;
    close(d); /* just made: ours */
    say_unmarked();
    return -1;
}

/* The dup an import about to be recorded keeps of fd, within the bound;
 * -1 when it is not to be cached (bound reached, or out of fds). The app's
 * errno is left alone. */
int ipcc_vmm_fd_keep(struct ipcc_vmm_table *t, int fd)
{
    int saved_errno = errno;
    rlim_t soft = soft_limit();
    int d = -1;
    if (claim(t, soft) && (d = marked_dup(fd, soft)) < 0) { /* the place goes back */
        ipcc_lock();
        ipcc_vmm_fd_unclaim(t);
        ipcc_unlock();
    }
    errno = saved_errno;
    return d;
}

/* A kept dup the table did not take after all. */
void ipcc_vmm_fd_give_back(struct ipcc_vmm_table *t, int fd)
{
    int saved_errno = errno;
    ipcc_fd_close_ours(fd);
    ipcc_lock();
    ipcc_vmm_fd_unclaim(t);
    ipcc_unlock();
    errno = saved_errno;
}
