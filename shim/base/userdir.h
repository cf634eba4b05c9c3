/* userdir.h - userdir.c's interface: the per-user directory, and files opened safely. */
#ifndef IPCC_USERDIR_H
#define IPCC_USERDIR_H

#include <stddef.h>

#include "common.h"

struct stat;
IPCC_HIDDEN int ipcc_fstat(int fd, struct stat *st);
IPCC_HIDDEN int ipcc_userdir_open(void);
IPCC_HIDDEN int ipcc_userdir_path(char *out, size_t cap);
IPCC_HIDDEN int ipcc_dir_open_checked(const char *path);
IPCC_HIDDEN int ipcc_file_open_checked(int dirfd, const char *name, int flags);

#endif
