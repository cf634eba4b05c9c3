/* fdmark.h - fdmark.c's interface: fds the library can prove are its own. */
#ifndef IPCC_FDMARK_H
#define IPCC_FDMARK_H

#include "common.h"

IPCC_HIDDEN int ipcc_fd_mark(int fd, int floor);
IPCC_HIDDEN int ipcc_fd_ours(int fd);
IPCC_HIDDEN int ipcc_fd_close_ours(int fd);

#endif
