/*
 * userdir_stub.c - TEMPORARY stand-in for shim/userdir.c (written elsewhere),
 * so that the release ledger can be built and tested alone. To be deleted
 * when userdir.c lands; it implements only the declared contract:
 *
 *   ipcc_userdir_open() returns an O_DIRECTORY descriptor of a checked
 *   per-user directory - $XDG_RUNTIME_DIR/ipccache, else /tmp/ipccache-<uid> -
 *   created 0700, owned by us, not a link, no access for others; or -1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

int ipcc_userdir_open(void)
{
    char path[512];
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && xdg[0] == '/')
        snprintf(path, sizeof(path), "%s/ipccache", xdg);
    else
        snprintf(path, sizeof(path), "/tmp/ipccache-%lu", (unsigned long)geteuid());
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return -1;
    if (syscall(SYS_fstat, fd, &st) != 0 || /* glibc's fstat is 2.33's */ !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}
