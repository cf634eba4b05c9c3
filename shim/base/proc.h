/* proc.h - proc.c's interface: processes named by pid and start time; exit handlers. */
#ifndef IPCC_PROC_H
#define IPCC_PROC_H

#include <stdint.h>

#include "common.h"

/* A process as the ledger names it: a pid alone may be reused, so with its
 * start time (clock ticks after boot, /proc/<pid>/stat field 22). */
struct ipcc_proc {
    int32_t pid;
    uint32_t zero_pad;
    uint64_t start;
};
IPCC_HIDDEN struct ipcc_proc ipcc_proc_self(void);
IPCC_HIDDEN uint64_t ipcc_proc_start(int32_t pid);
IPCC_HIDDEN int ipcc_proc_alive(int32_t pid, uint64_t start);
IPCC_HIDDEN void ipcc_atexit(void (*fn)(void));

#endif
