/*
 * barrier.c - a memory barrier run on every thread of the process at once
 * (membarrier(2), private expedited: Linux 4.14 and later).
 *
 * A pair of threads that must each see the other's store before its own
 * load (Dekker's pattern) needs a full fence on both sides. When one side
 * runs millions of times a second and the other rarely, the frequent side
 * may use a compiler fence alone and the rare side this barrier: it makes
 * every running thread of the process pass a full fence before it returns.
 * The hit path's loans use it (legacy_table.c).
 */
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base.h"

/* From <linux/membarrier.h>, which older kernel headers lack. */
#define CMD_PRIVATE_EXPEDITED (1 << 3)
#define CMD_REGISTER_PRIVATE_EXPEDITED (1 << 4)

static long membarrier(int cmd)
{
#ifdef __NR_membarrier
    return syscall(__NR_membarrier, cmd, 0, 0);
#else
    (void)cmd;
    errno = ENOSYS;
    return -1;
#endif
}

/* Registers the process for the barrier: 0, or -1 where the kernel is older
 * or a sandbox refuses the call. Once per process is enough (a fork child
 * inherits it); it may take milliseconds (the kernel waits for a grace
 * period when threads exist), so never under the table lock. */
int ipcc_barrier_start(void)
{
    return membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) == 0 ? 0 : -1;
}

/* Every thread of the process that is running now passes a full memory
 * barrier before this returns (those not running passed one when they
 * stopped). 0, or -1 if the kernel refused. A few microseconds: an
 * interrupt to each processor running one of our threads. */
int ipcc_barrier_all_threads(void)
{
    return membarrier(CMD_PRIVATE_EXPEDITED) == 0 ? 0 : -1;
}
