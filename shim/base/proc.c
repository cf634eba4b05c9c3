/*
 * proc.c - a process as the ledger and the stats marker name it: pid and
 * start time, since a pid alone may be reused. Moved out of ledger.c so that
 * the marker (stats/) needs nothing above the basics; and exit handlers
 * registered safely (from lifecycle.c, for the same reason).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"
#include "fmt.h"
#include "lock.h"

/* Start time of pid in clock ticks after boot (field 22 of /proc/pid/stat);
 * 0 if it is gone, a zombie (its mappings died with it), or /proc cannot
 * tell. Async-signal-safe: marker.c calls it in a fork child. */
uint64_t ipcc_proc_start(int32_t pid)
{
    char path[40], buf[1024];
    struct ipcc_out o = IPCC_OUT(path);
    ipcc_out_str(&o, "/proc/");
    ipcc_out_u64(&o, (uint64_t)pid);
    ipcc_out_str(&o, "/stat");
    if (pid <= 0 || ipcc_out_end(&o) < 0)
        return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The name in parentheses may hold anything; fields follow the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
        return 0;
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    uint64_t start = 0;
    for (p = p ? p + 1 : NULL; p && *p >= '0' && *p <= '9'; p++)
        start = start * 10 + (uint64_t)(*p - '0');
    return start;
}

/* Recomputed when the pid changes: a fork child is another process. */
struct ipcc_proc ipcc_proc_self(void)
{
    static _Thread_local struct ipcc_proc self;
    int32_t pid = (int32_t)getpid();
    if (self.pid != pid) {
        self.start = ipcc_proc_start(pid);
        self.pid = pid;
    }
    return self;
}

/* Whether the process (pid, start) still runs. A start of 0 means unknown:
 * then the pid alone decides. Same user only, so a pid we may not signal
 * (EPERM) belongs to someone else now. */
int ipcc_proc_alive(int32_t pid, uint64_t start)
{
    if (pid <= 0 || kill(pid, 0) != 0)
        return 0;
    if (start == 0 || ipcc_proc_self().start == 0) /* no /proc to ask */
        return 1;
    return ipcc_proc_start(pid) == start;
}

/* atexit() holds glibc's lock of the exit handlers, which exit() takes too
 * and a fork copies held: the guard keeps signals (a handler calling exit())
 * and forks out the instant it takes. */
void ipcc_atexit(void (*fn)(void))
{
    sigset_t saved;
    ipcc_fork_guard_enter(&saved);
    atexit(fn);
    ipcc_fork_guard_leave(&saved);
}
