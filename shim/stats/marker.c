/*
 * marker.c - the file that says "this process has ipccache's stats handler".
 *
 * <per-user directory>/ipccache-<pid>.marker is written when the handler is
 * installed (and again by each fork child, which inherits the handler) and
 * removed at exit. ipccache-stats signals only a process whose marker names
 * its pid and its start time: never a program that uses the signal for
 * itself, nor a process that got the pid of one that exited. The marker
 * also says where the process writes its stats line, so the tool need not
 * guess from the environment:
 *
 *   ipccache-marker 1
 *   pid=<pid>
 *   start=<field 22 of /proc/<pid>/stat: start time, clock ticks after boot>
 *   signal=<signal number>
 *   base=<address where libipccache.so is mapped, decimal>
 *   stats_file=<IPCCACHE_STATS_FILE expanded for the pid, or empty>
 *   request_dir=<directory of the request file, or empty>
 *
 * After an exec the pid and start time stay but the library's mapping goes
 * (or moves): the base tells a marker left by the program before its exec.
 *
 * Written under a temporary name and renamed, so a reader never sees half a
 * marker. Everything here is async-signal-safe: a fork child runs it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h> /* renameat */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stats_impl.h"

#define MARKER_SCHEMA 1

static _Atomic long marker_pid; /* whose marker this process wrote; 0: none */
static _Atomic int remove_registered;
static uintptr_t library_base; /* found at the first write; a fork child keeps it */
static _Atomic int base_looked_up;

/* ipccache-<pid><suffix> into buf. */
static int marker_name(char *buf, size_t cap, long pid, const char *suffix)
{
    struct ipcc_out o = { buf, cap - 1, 0 };
    ipcc_out_str(&o, "ipccache-");
    ipcc_out_u64(&o, (uint64_t)pid);
    ipcc_out_str(&o, suffix);
    return ipcc_out_end(&o);
}

static void put_line(struct ipcc_out *o, const char *key, const char *value)
{
    ipcc_out_str(o, key);
    ipcc_out_str(o, value);
    ipcc_out_str(o, "\n");
}

static int format_marker(char *buf, size_t cap, long pid, int sig, const char *request_dir)
{
    char stats_file[sizeof(ipcc_config.stats_file) + 64] = "";
    if (ipcc_config.stats_file[0] &&
        ipcc_config_stats_path(ipcc_config.stats_file, pid, stats_file, sizeof(stats_file)) < 0)
        stats_file[0] = '\0';
    struct ipcc_out o = { buf, cap - 1, 0 };
    ipcc_out_str(&o, "ipccache-marker ");
    ipcc_out_u64(&o, MARKER_SCHEMA);
    ipcc_out_str(&o, "\npid=");
    ipcc_out_u64(&o, (uint64_t)pid);
    ipcc_out_str(&o, "\nstart=");
    ipcc_out_u64(&o, ipcc_proc_start((int32_t)getpid()));
    ipcc_out_str(&o, "\nsignal=");
    ipcc_out_u64(&o, (uint64_t)sig);
    ipcc_out_str(&o, "\nbase=");
    ipcc_out_u64(&o, (uint64_t)library_base);
    ipcc_out_str(&o, "\n");
    put_line(&o, "stats_file=", stats_file);
    put_line(&o, "request_dir=", request_dir);
    return ipcc_out_end(&o) < 0 ? -1 : (int)(o.p - buf);
}

static void remove_marker(void)
{
    long pid = atomic_load(&marker_pid);
    char name[64];
    if (pid != (long)getpid() || marker_name(name, sizeof(name), pid, ".marker") < 0)
        return;
    int dirfd = ipcc_userdir_open();
    if (dirfd >= 0) {
        unlinkat(dirfd, name, 0);
        close(dirfd);
    }
}

static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w <= 0)
            return -1;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Writes this process's marker; 0 or -1. The first call registers its
 * removal at exit, so it must not be made from a signal handler; later
 * calls (a fork child's) may be. */
int ipcc_marker_write(int sig, const char *request_dir)
{
    /* dladdr takes the loader's lock: only on the first call, never in a
     * fork child, which may have inherited that lock taken. */
    Dl_info self;
    if (!atomic_exchange(&base_looked_up, 1) && dladdr((void *)ipcc_marker_write, &self))
        library_base = (uintptr_t)self.dli_fbase;
    long pid = (long)getpid();
    char text[1024], name[64], tmp[64];
    int len = format_marker(text, sizeof(text), pid, sig, request_dir);
    if (len < 0 || marker_name(name, sizeof(name), pid, ".marker") < 0 ||
        marker_name(tmp, sizeof(tmp), pid, ".marker.new") < 0)
        return -1;
    int dirfd = ipcc_userdir_open();
    if (dirfd < 0)
        return -1;
    int fd = ipcc_file_open_checked(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC);
    int ok = fd >= 0 && write_all(fd, text, (size_t)len) == 0;
    if (fd >= 0)
        close(fd);
    ok = ok && renameat(dirfd, tmp, dirfd, name) == 0;
    if (!ok)
        unlinkat(dirfd, tmp, 0);
    close(dirfd);
    if (!ok)
        return -1;
    atomic_store(&marker_pid, pid);
    if (!atomic_exchange(&remove_registered, 1))
        ipcc_atexit(remove_marker);
    return 0;
}
