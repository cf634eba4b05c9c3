/* lock.h - lock.c's interface: the table lock and the fork guard. */
#ifndef IPCC_LOCK_H
#define IPCC_LOCK_H

#include <signal.h>

#include "common.h"

IPCC_HIDDEN void ipcc_lock(void);
IPCC_HIDDEN void ipcc_unlock(void);
IPCC_HIDDEN int ipcc_lock_try(void);
IPCC_HIDDEN int ipcc_lock_held_here(void);
IPCC_HIDDEN void ipcc_lock_reset(void);
/* Around a C library call whose lock a fork would copy held (lock.c). */
IPCC_HIDDEN void ipcc_fork_guard_enter(sigset_t *saved);
IPCC_HIDDEN void ipcc_fork_guard_leave(const sigset_t *saved);
IPCC_HIDDEN void ipcc_fork_guard_hold(void);
IPCC_HIDDEN void ipcc_fork_guard_release(void);
IPCC_HIDDEN void ipcc_fork_guard_reset(void);
IPCC_HIDDEN void ipcc_fork_guard_close(void); /* the fork handler of start's */
IPCC_HIDDEN void ipcc_fork_guard_open(void);

#endif
