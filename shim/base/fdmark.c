/*
 * fdmark.c - fds the library keeps (the VMM path's dups) marked, so that it
 * never closes or reuses a number that is no longer its own: a program may
 * close them (close_range after fork, a daemon closing every fd), and the
 * number then names the program's next file.
 *
 * The number alone proves nothing, and neither does fstat: every export of
 * the driver is an open of /dev/nvidiactl, as are the driver's own fds. What
 * the library kept is an open file description at a number, and an epoll
 * instance of its own holds exactly that pair: epoll_ctl finds a
 * registration by the file the number names now and the number, so a
 * EPOLL_CTL_MOD (events none, before and after) succeeds only while the
 * number still names the kept description. No other state of the file is
 * touched (flags, owner and locks are the description's, which the exporter
 * shares), and it costs one system call. A file its driver cannot poll
 * cannot be marked (the driver's files poll): the caller keeps none then.
 *
 * A fork child shares the instance: it checks with MOD and closes the dups
 * it inherited without unregistering them (the parent's stay), and marks
 * new ones in an instance of its own. The instance itself is kept high and
 * close-on-exec; if the program closed it, its number is left alone (a
 * check on what came next fails) and a new one is made.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "fdmark.h"

static _Atomic int marks = -1;        /* the epoll instance */
static _Atomic pid_t marks_pid;       /* the process that made it */

/* A new instance at floor or above (anywhere when nothing is free there). */
static int new_instance(int floor)
{
    int e = epoll_create1(EPOLL_CLOEXEC);
    if (e < 0 || e >= floor)
        return e;
    int high = fcntl(e, F_DUPFD_CLOEXEC, floor);
    if (high < 0)
        return e;
    close(e); /* just made: ours */
    return high;
}

/* This process's instance, made if there is none or it is the parent's. */
static int own_instance(int floor)
{
    int e = atomic_load(&marks);
    if (e >= 0 && atomic_load(&marks_pid) == getpid())
        return e;
    int made = new_instance(floor);
    if (made < 0)
        return -1;
    if (!atomic_compare_exchange_strong(&marks, &e, made)) {
        close(made); /* another thread's came first */
        return e;
    }
    atomic_store(&marks_pid, getpid());
    return made;
}

/* Marks fd, kept at floor or above, as ours: 1, or 0 when it cannot be (a
 * file that cannot be polled, or out of fds). The app's errno is kept. */
int ipcc_fd_mark(int fd, int floor)
{
    int saved_errno = errno;
    struct epoll_event ev = { .events = 0, .data.fd = fd };
    int ok = 0;
    for (int tries = 0; tries < 2 && !ok; tries++) {
        int e = own_instance(floor);
        if (e < 0)
            break;
        ok = epoll_ctl(e, EPOLL_CTL_ADD, fd, &ev) == 0 || errno == EEXIST;
        if (!ok && (errno == EBADF || errno == EINVAL)) /* the instance's number is not ours now */
            atomic_compare_exchange_strong(&marks, &e, -1);
        else
            break;
    }
    errno = saved_errno;
    return ok;
}

/* Whether fd still names the open file description that was marked at it. */
int ipcc_fd_ours(int fd)
{
    int e = atomic_load(&marks);
    if (e < 0 || fd < 0)
        return 0;
    int saved_errno = errno;
    struct epoll_event ev = { .events = 0, .data.fd = fd };
    int ours = epoll_ctl(e, EPOLL_CTL_MOD, fd, &ev) == 0;
    errno = saved_errno;
    return ours;
}

/* Closes fd if it is still ours (1), else leaves it alone (0). */
int ipcc_fd_close_ours(int fd)
{
    if (!ipcc_fd_ours(fd))
        return 0;
    int saved_errno = errno;
    if (atomic_load(&marks_pid) == getpid()) /* a child leaves the parent's marks */
        epoll_ctl(atomic_load(&marks), EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    errno = saved_errno;
    return 1;
}
