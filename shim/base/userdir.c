/*
 * userdir.c - the per-user directory, and files opened there safely.
 *
 * Files that tools of the same user (or root) look for live in one
 * directory per user: $XDG_RUNTIME_DIR/ipccache when XDG_RUNTIME_DIR is an
 * absolute directory of ours with mode 0700 (what systemd makes at login),
 * else /tmp/ipccache-<uid>. It is created 0700. Another local user could
 * create that name first (a directory of theirs, a symlink), or put a FIFO
 * or a symlink where we expect a file of ours, so everything is checked
 * after it is opened: a directory must be ours and writable by nobody else,
 * a file must be a regular file of ours; links are never followed.
 *
 * The path is found once, outside any signal handler. After that,
 * ipcc_userdir_open and ipcc_file_open_checked use only open, openat, fstat
 * and close: async-signal-safe, and a FIFO cannot block them (O_NONBLOCK).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "userdir.h"
#include "fmt.h"
#include "log.h"

#define DIR_NAME "ipccache"
#define TMP_FALLBACK "/tmp/ipccache-"

static char dir_path[256];
static _Atomic int dir_state; /* 0: not looked for yet, 1: dir_path is usable, -1: none */
static pthread_once_t find_once = PTHREAD_ONCE_INIT;

/* fstat as the kernel offers it: glibc's own fstat symbol is versioned
 * 2.33, which would raise the glibc the library needs (see glibc_floor.h).
 * The kernel's struct stat is glibc's on x86_64 and aarch64. */
int ipcc_fstat(int fd, struct stat *st)
{
    return (int)syscall(SYS_fstat, fd, st);
}

static int ours(const struct stat *st)
{
    return st->st_uid == geteuid();
}

/* Opens path as a directory, not through a link; -1 unless it is ours and
 * nobody else may write to it (exactly 0700 when `exact`). */
static int open_dir(const char *path, int exact)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (ipcc_fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || !ours(&st) ||
        (exact ? (st.st_mode & 07777) != 0700 : (st.st_mode & (S_IWGRP | S_IWOTH)) != 0)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

int ipcc_dir_open_checked(const char *path)
{
    return open_dir(path, 0);
}

/* $XDG_RUNTIME_DIR/ipccache if XDG_RUNTIME_DIR qualifies, else the /tmp
 * fallback; 0, or -1 if the name does not fit. */
static int choose_path(void)
{
    struct ipcc_out o = IPCC_OUT(dir_path);
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int fd = xdg && xdg[0] == '/' ? open_dir(xdg, 1) : -1;
    if (fd >= 0) {
        close(fd);
        ipcc_out_str(&o, xdg);
        ipcc_out_str(&o, "/" DIR_NAME);
    } else {
        ipcc_out_str(&o, TMP_FALLBACK);
        ipcc_out_u64(&o, geteuid());
    }
    return ipcc_out_end(&o);
}

/* Creates the directory 0700 (whatever the umask) or checks the one there. */
static void find_dir(void)
{
    if (choose_path() < 0) {
        ipcc_log(IPCC_LOG_WARN, "per-user directory name too long; no files are used");
        atomic_store(&dir_state, -1);
        return;
    }
    int created = mkdir(dir_path, 0700) == 0;
    int fd = open_dir(dir_path, 0);
    if (fd >= 0 && created)
        fchmod(fd, 0700);
    if (fd < 0) {
        ipcc_log(IPCC_LOG_WARN,
                 "%s is not a directory of this user that only it can write to; "
                 "stats go to stderr and ipccache-stats cannot ask this process",
                 dir_path);
        atomic_store(&dir_state, -1);
        return;
    }
    close(fd);
    atomic_store(&dir_state, 1);
}

static int found(void)
{
    if (atomic_load(&dir_state) == 0)
        pthread_once(&find_once, find_dir);
    return atomic_load(&dir_state) > 0;
}

/* The per-user directory as an O_DIRECTORY descriptor (the caller closes
 * it), checked again at each call; -1 if there is none. The first call looks
 * for it and may create it: make that call outside signal handlers. */
int ipcc_userdir_open(void)
{
    return found() ? open_dir(dir_path, 0) : -1;
}

/* The per-user directory's path into out; 0, or -1 if there is none. */
int ipcc_userdir_path(char *out, size_t cap)
{
    if (!found() || strlen(dir_path) >= cap)
        return -1;
    strcpy(out, dir_path);
    return 0;
}

/* Opens name relative to dirfd (AT_FDCWD for a plain path) with `flags`
 * plus O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC (0600 if created); -1 unless what was
 * opened is a regular file of ours. Never blocks on a FIFO. */
int ipcc_file_open_checked(int dirfd, const char *name, int flags)
{
    int fd = openat(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    struct stat st;
    if (ipcc_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !ours(&st)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}
